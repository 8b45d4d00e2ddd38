"""What the agent is told about a dead-neurons instance."""

INPUTS = """\
You are given `model`, a small MLP (`nn.Sequential`: Linear -> ReLU -> Linear) that maps {n_in} inputs
to {n_out} outputs. Inputs are drawn uniformly from the box [{lo}, {hi}]^{n_in}; `X` holds {n_probe}
such samples and `box` is (lo, hi).

Some inputs are dead: every outgoing weight of a dead input is exactly zero, so the model's output
never depends on it.{distractor_note} Find all dead inputs.

Answer: a JSON list of input indices (0..{last}), e.g. [3, 17]. You get one graded submission."""

HIDDEN = """\
You are given `model`, a small MLP (`nn.Sequential`: Linear -> ReLU -> Linear) that maps {n_in} inputs
through {n_hidden} hidden ReLU units to {n_out} outputs. Inputs are drawn uniformly from the box
[{lo}, {hi}]^{n_in}; `X` holds {n_probe} such samples and `box` is (lo, hi).

Some hidden units are dead on the box: their pre-activation is negative for every input in the box,
i.e. b_j + sum_i max(w_ji * lo, w_ji * hi) < 0, so they never fire. Some live units fire only
rarely (on about 1-5% of the box). Find all dead hidden units.

Answer: a JSON list of hidden-unit indices (0..{last}), e.g. [3, 17]. You get one graded submission."""

MEDIUM_NOTE = " Beware: some live inputs have tiny (but nonzero) weights."
