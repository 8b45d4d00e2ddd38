"""What the agent is told about a superposition instance."""

TEXT = """\
You are given `model`, a toy model of superposition: {n} features x (a vector in R^{n}) are compressed into
{m} hidden dimensions, h = model.W @ x (model.W is [{m}, {n}]), and read back through a ReLU,
model(x) = relu(x @ model.W.T @ model.W + model.b). `x` [{n_probe}, {n}] holds sparse feature vectors like
those the model is meant for (each feature active with a small probability, values in [0, 1]).

Definitions:
- feature i is *represented* if model(e_i)[i] - model(0)[i] >= {rep}, where e_i is the one-hot input of
  feature i and 0 the zero input;
- two represented features *share dimensions* if the cosine of their columns of model.W has absolute
  value >= {shared}; the *groups* are the connected sets of represented features under that relation,
  with at least 2 features each (a feature alone in its own dimensions is in no group).
Find the represented features and the groups.

Answer: a JSON object {{"represented": [feature indices in 0..{last}], "groups": [[i, j], [k, l, m], ...]}},
e.g. {{"represented": [0, 3, 5, 7], "groups": [[0, 3]]}}. Scoring: half Cohen's kappa of your represented /
not-represented labels, half the Jaccard index of the pairs of features you put in the same group. You get
one graded submission."""
