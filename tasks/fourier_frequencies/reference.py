"""Reference solution: DFT of the embedding over the token axis, power per frequency, stated rule."""

SNIPPETS = (
    """
W = model.embed.weight.detach()
print(tuple(W.shape), p)
""",
    """
spec = torch.fft.fft(W, dim=0).abs() ** 2
power = spec.sum(dim=1)[1:(p - 1) // 2 + 1]
power = power / power.max()
ranked = sorted(range(len(power)), key=lambda i: -float(power[i]))
print([(i + 1, round(float(power[i]), 3)) for i in ranked[:10]])
answer = [i + 1 for i in range(len(power)) if float(power[i]) >= 0.325]
print(json.dumps(answer))
""",
)
