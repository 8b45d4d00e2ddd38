"""What the agent is told about a copy-head instance."""

TEXT = """\
You are given `model`, an attention-only transformer with the TransformerLens interface ({n_layers} layers x
{n_heads} heads, vocabulary {vocab}, context {n_ctx}): `model(tokens)`, `model.run_with_cache(tokens)`,
`model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])`, hook names such as `blocks.0.attn.hook_z`
([batch, pos, head, d_head]) and `blocks.0.attn.hook_pattern`, `model.cfg`, `model.W_Q`/`W_K`/`W_V`/`W_O`,
`utils.get_act_name`.

Some vocabulary items are *marked* (`marked` lists them). Each sequence in `tokens` [{n_probe}, {n_ctx}]
contains exactly one marked token; at the last position the model predicts that marked token
(`targets` holds it for each sequence). Measure behaviour by the margin
logit(target) - max other logit at the last position.

One attention head is responsible for copying the marked token to the output; the other heads have
other jobs (several of them attend to marked tokens, and several write token identities into the
output space, some of them the marked tokens; on these sequences none of them carries the marked token to
the output at the last position as the copy head does). Find the copy head.

Answer: a JSON list of [layer, head] pairs, e.g. [[1, 4]]. You get one graded submission."""
