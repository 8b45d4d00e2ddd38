"""What the agent is told about a modular-addition instance."""

TEXT = """\
You are given `model`, a network that computes (a + b) mod p for the prime p = {p} (`p` in the namespace).
For a batch of pairs `tokens` [batch, 2] it returns logits [batch, {p}] over c = (a + b) mod p, as
model.unembed(model.mlp(x)) with x the concatenation [model.embed(a), model.embed(b)] ({d} + {d} dims) and
model.mlp a gated MLP: model.mlp.out(model.mlp.left(x) * model.mlp.right(x)), {h} hidden units, hook point
model.mlp.hidden. `tokens` holds all p*p pairs; the model is right on every pair.

The model adds by a Fourier algorithm that uses a few *key* frequencies k (waves cos(2*pi*k*t/p) and
sin(2*pi*k*t/p) over the token t). The embedding also carries other frequencies, some as strong as the
keys, that the model does not use. Operational definition: let m be the mean over all pairs of
(logit of the correct c) - (mean logit). Remove frequency k from the embedding by projecting the
token-axis vectors cos(2*pi*k*t/p) and sin(2*pi*k*t/p) out of every column of model.embed.weight, and
measure the drop in m. A key frequency's drop is at least {key}% of the largest drop over k = 1..{half};
every other frequency's drop is below {other}% of it. Frequencies k and p-k are the same. Find all key
frequencies.

Answer: a JSON list of frequencies in 1..{half}, e.g. [4, 17]. You get one graded submission."""
