"""Reference solution: ablate each frequency of the embedding (token axis) and measure the drop of
the correct-logit margin over all pairs; keys are the frequencies whose drop is large."""

SNIPPETS = (
    """
W = model.embed.weight.detach()
target = (tokens[:, 0] + tokens[:, 1]) % p
def margin(w):
    logits = model.unembed(model.mlp(w[tokens].flatten(-2)))
    return float((logits.gather(1, target[:, None])[:, 0] - logits.mean(dim=1)).mean())
clean = margin(W)
print(tuple(W.shape), p, round(clean, 3))
""",
    """
t = torch.arange(p, dtype=torch.float64)
Wd = W.double()
drops = []
for k in range(1, (p - 1) // 2 + 1):
    B = torch.stack([torch.cos(2 * math.pi * k * t / p), torch.sin(2 * math.pi * k * t / p)], dim=1)
    B = B / B.norm(dim=0)
    drops.append(clean - margin((Wd - B @ (B.T @ Wd)).float()))
top = max(drops)
ranked = sorted(range(len(drops)), key=lambda i: -drops[i])
print([(i + 1, round(drops[i] / top, 3)) for i in ranked[:8]])
answer = [i + 1 for i in range(len(drops)) if drops[i] >= 0.27 * top]
print(json.dumps(answer))
""",
)
