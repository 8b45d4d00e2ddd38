"""Reference solution: how much of each unit's variance is explained by the stated input alone."""

SNIPPETS = (
    """
print(model)
print("target input:", target)
""",
    """
lo, hi = box
xs = lo + (hi - lo) * torch.rand(4096, X.shape[1])
with torch.no_grad():
    h = model.left(xs) * model.right(xs)
h = h - h.mean(dim=0)
f = xs[:, target] - xs[:, target].mean()
r2 = (h * f[:, None]).sum(dim=0) ** 2 / ((h ** 2).sum(dim=0) * (f ** 2).sum())
ranked = sorted(range(h.shape[1]), key=lambda j: -float(r2[j]))
print([(j, round(float(r2[j]), 4)) for j in ranked[:4]])
answer = [ranked[0]]
print(json.dumps(answer))
""",
)
