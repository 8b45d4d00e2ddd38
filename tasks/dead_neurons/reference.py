"""Reference solution: the snippets a careful agent sends (no knowledge of the construction)."""

SNIPPETS = (
    # Look at the architecture and the weight scales first.
    """
for name, p in model.named_parameters():
    print(name, tuple(p.shape), float(p.detach().abs().mean()))
""",
    # Inputs: a column whose norm is negligible next to the typical column is dead.
    # Hidden units: the exact upper bound of the pre-activation over the box, checked by sampling.
    """
W = model[0].weight.detach()
b = model[0].bias.detach()
lo, hi = box
col = W.norm(dim=0)
inputs_dead = [i for i in range(W.shape[1]) if float(col[i]) < 1e-2 * float(col.median())]
bound = b + torch.maximum(W * lo, W * hi).sum(dim=1)
xs = lo + (hi - lo) * torch.rand(20000, W.shape[1])
fires = ((xs @ W.T + b) > 0).float().mean(dim=0)
units_dead = [j for j in range(W.shape[0]) if float(bound[j]) < 0 and float(fires[j]) == 0.0]
print("near-zero input columns:", inputs_dead)
print("units that can never fire:", units_dead)
""",
    """
answer = inputs_dead if len(inputs_dead) > 0 else units_dead
print(json.dumps(answer))
""",
)
