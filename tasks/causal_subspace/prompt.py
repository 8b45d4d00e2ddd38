"""What the agent is told about a causal-subspace instance."""

TEXT = """\
You are given `model`, a small network on binary inputs: `x` [{n_probe}, {n_in}] holds probe inputs, drawn from
the (structured, not uniform) input distribution the model is used on. It computes a hidden state
h = model.enc(x) ({d} dims; `model.hidden` is an identity hook point on it) and then
logits = model.head(h) = model.out(relu(model.mlp_in(h))) over {n_classes} classes.

The output depends on an intermediate variable of dimension {k} that the model stores in a {k}-dimensional
subspace S of the hidden state (in no particular basis). Other directions of h are read by model.mlp_in too,
but on inputs from this distribution they do not affect the output. S is the subspace for which interchange
interventions work: for a base input b and a source input s, the hidden state h_b + P_S (h_s - h_b) (P_S the
orthogonal projection onto S) makes the model output the class that the variable's value in s implies.

Find S. Answer: a basis of S as a list of vectors of {d} numbers (any basis; it is orthonormalised), for
example built in the sandbox as `basis` and submitted with {{"solution_from": "basis"}}. Scoring: the
interchange-intervention accuracy of your subspace on fixed pairs of probe inputs, chance-corrected against
not intervening, times its overlap with S (so extra dimensions cost you). You get one graded submission."""
