"""What the agent is told about a head-roles instance."""

EXAMPLE = '{"L1H0": "previous-token", "L1H1": "none", "L2H0": "induction"}'

TEXT = """\
You are given `model`, a transformer with the TransformerLens interface ({n_layers} blocks x {n_heads} heads,
vocabulary {vocab}, context {n_ctx}): `model(tokens)`, `model.run_with_cache(tokens)`, hook names such as
`blocks.1.attn.hook_pattern` ([batch, head, query, key]), `model.cfg`, `utils.get_act_name`. Block 0 is only an
MLP that re-encodes the tokens and positions (its attention is switched off: all its weights are zero); blocks
1-{last} are attention only (their MLP weights are zero). The heads to label are those of blocks 1-{last}.

`tokens` [{n_probe}, {n_ctx}] holds sequences of {half} random tokens repeated twice. Every head has one role,
defined by a detection score: its mean attention, over the sequences in `tokens`, on
- "previous-token": position i-1 (queries i >= 1);
- "duplicate-token": the earlier copy of the current token, i-{half} (queries i >= {half});
- "induction": the token after that copy, i-{half}+1 (queries i >= {half});
- "attend-to-first": position 0 (queries i >= 1);
- "local": positions i-2 and i-3 together (queries i >= 3).
A head has the role whose score is at least {threshold}; a head with no score that high is "none".
Roles can repeat, and any head can hold any role its block allows (induction needs an earlier head).

Answer: a JSON object with a role for every head of blocks 1-{last}, keyed "L<block>H<head>", e.g. {example}
(but for all {n_heads} heads of each; block 0's heads may be left out or labelled "none"). Scoring is
chance-corrected accuracy over the heads of blocks 1-{last}; a missing head counts as wrong. You get one graded
submission."""
