"""What the agent is told about a head-roles instance."""

EXAMPLE = '{"L0H0": "previous-token", "L0H1": "none", "L1H0": "induction"}'

TEXT = """\
You are given `model`, an attention-only transformer with the TransformerLens interface ({n_layers} layers x
{n_heads} heads, vocabulary {vocab}, context {n_ctx}): `model(tokens)`, `model.run_with_cache(tokens)`, hook
names such as `blocks.0.attn.hook_pattern` ([batch, head, query, key]), `model.cfg`, `utils.get_act_name`.

`tokens` [{n_probe}, {n_ctx}] holds sequences of {half} random tokens repeated twice. Every head has one role,
defined by a detection score: its mean attention, over the sequences in `tokens`, on
- "previous-token": position i-1 (queries i >= 1);
- "duplicate-token": the earlier copy of the current token, i-{half} (queries i >= {half});
- "induction": the token after that copy, i-{half}+1 (queries i >= {half});
- "attend-to-first": position 0 (queries i >= 1);
- "local": positions i-2 and i-3 together (queries i >= 3).
A head has the role whose score is at least {threshold}; a head with no score that high is "none".
Roles can repeat, and any head can hold any role its layer allows.

Answer: a JSON object with a role for every head, keyed "L<layer>H<head>", e.g. {example} (but for all
{n_layers} x {n_heads} heads). Scoring is chance-corrected accuracy over all heads; a missing head counts as
wrong. You get one graded submission."""
