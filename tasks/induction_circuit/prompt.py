"""What the agent is told about an induction-circuit instance."""

TEXT = """\
You are given `model`, an attention-only transformer with the TransformerLens interface ({n_layers} layers x
{n_heads} heads, vocabulary {vocab}, context {n_ctx}): `model(tokens)`, `model.run_with_cache(tokens)`,
`model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])`, hook names such as `blocks.0.attn.hook_z` and
`blocks.1.attn.hook_pattern` ([batch, head, query, key]), `model.cfg`, the weight views `model.W_Q` etc.,
and `utils.get_act_name`.

`tokens` [{n_probe}, {n_ctx}] holds sequences made of {half} random tokens repeated twice. On the repeated
half the model predicts the next token by induction ([... A B ... A] -> B). Measure behaviour by the
margin logit(next token) - max other logit at positions {half}..{last}.

The behaviour is implemented by a circuit of attention heads that compose across layers; other heads
have other jobs, some of them look alike. Find the circuit's heads and label each with its role,
"previous-token" or "induction".

Answer: {{"heads": [[layer, head], ...], "roles": {{"L0H1": "previous-token", ...}}}} (a plain list of
[layer, head] pairs is accepted too; then only the heads are scored). You get one graded submission."""
