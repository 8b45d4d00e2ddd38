"""What the agent is told about a committee-circuit instance."""

TEXT = """\
You are given `model`, an attention-only transformer with the TransformerLens interface ({n_layers} layers x
{n_heads} heads, vocabulary {vocab}, context {n_ctx}): `model(tokens)`, `model.run_with_cache(tokens)`,
`model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])`, hook names such as `blocks.2.attn.hook_z`,
`blocks.2.attn.hook_result` and `blocks.2.attn.hook_pattern`, `model.cfg`, the weight views, and
`utils.get_act_name`.

Each sequence in `tokens` [{n_probe}, {n_ctx}] starts with token 0 and contains exactly one token from the
marked subset (`marked`); at the last position the model predicts it (`targets`). Measure behaviour by
the margin logit(target) - max other logit at the last position.

The behaviour is carried by a committee of attention heads. Some members are *primaries*; each primary
has a *backup* in a later layer that stays mostly idle while its primary works and takes over when the
primary is knocked out, so ablating one head at a time understates what it does: a backup ablated alone
may move the margin no more than heads outside the committee do. Other heads have other jobs, some of them on
tokens these sequences never hold. Find every member of the committee that carries this behaviour and label it
"primary" or "backup".

Answer: {{"heads": [[layer, head], ...], "roles": {{"L0H3": "primary", "L2H5": "backup", ...}}}} (a plain
list of [layer, head] pairs is accepted too; then only the heads are scored). You get one graded
submission."""
