"""Reference solution: the span of the output's Jacobian with respect to the hidden state, over the
probe inputs (directions the output does not depend on have no gradient, even if mlp_in reads them)."""

SNIPPETS = (
    """
h = model.enc(x).detach().requires_grad_(True)
logits = model.head(h)
rows = []
for c in range(logits.shape[1]):
    (g,) = torch.autograd.grad(logits[:, c].sum(), h, retain_graph=True)
    rows.append(g)
    (g2,) = torch.autograd.grad((logits[:, c] ** 2).sum(), h, retain_graph=True)
    rows.append(g2)
J = torch.cat(rows).double()
sv = torch.linalg.svdvals(J)
print(tuple(h.shape), [round(float(v / sv[0]), 4) for v in sv])
""",
    """
_, S, Vh = torch.linalg.svd(J, full_matrices=False)
k = int((S / S[0] >= 0.05).sum())
answer = [[round(float(v), 6) for v in row] for row in Vh[:k]]
print(json.dumps(answer))
""",
)
