"""Reference solution: regress every hidden unit on the stated product over samples from the box."""

SNIPPETS = (
    """
print(model)
print(target)
""",
    """
a, b = target
lo, hi = box
xs = lo + (hi - lo) * torch.rand(4096, X.shape[1])
acts = {}
def grab(module, inputs, output):
    acts["h"] = output.detach()
handle = model.hidden.register_forward_hook(grab)
with torch.no_grad():
    model(xs)
handle.remove()
h = acts["h"] - acts["h"].mean(dim=0)
f = xs[:, a] * xs[:, b]
f = f - f.mean()
r2 = (h * f[:, None]).sum(dim=0) ** 2 / ((h ** 2).sum(dim=0) * (f ** 2).sum())
best = sorted(range(len(r2)), key=lambda j: -float(r2[j]))
print([(j, round(float(r2[j]), 4)) for j in best[:4]])
answer = [best[0]]
print(json.dumps(answer))
""",
)
