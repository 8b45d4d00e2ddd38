"""What the agent is told about a fourier-frequencies instance."""

TEXT = """\
You are given `model`, a network over the prime vocabulary p = {p} (`p` in the namespace): for a batch of
token pairs `tokens` [batch, 2] it computes model.unembed(r + model.mlp(r)) with
r = model.embed(a) + model.embed(b). `tokens` holds all p*p pairs.

The token embedding model.embed.weight [{p}, {d}] is built from a few *key* frequencies: as a function of
the token t it contains waves cos(2*pi*k*t/p), sin(2*pi*k*t/p) in some directions of the embedding
space, plus weaker distractor frequencies and noise. Measure the strength of frequency k by its power
in the embedding (summed over embedding dimensions). A key frequency has at least 40% of the power of
the strongest frequency; every other frequency has less than 25% of it. Frequencies k and p-k are the
same frequency. Find all key frequencies.

Answer: a JSON list of frequencies in 1..{half}, e.g. [4, 17]. You get one graded submission."""
