"""Reference solution: one-hot reconstructions for representation, column cosines for the groups."""

SNIPPETS = (
    """
n = model.W.shape[1]
with torch.no_grad():
    increase = model(torch.eye(n)).diagonal() - model(torch.zeros(1, n))[0]
represented = [i for i in range(n) if float(increase[i]) >= 0.5]
print(n, tuple(model.W.shape), represented)
""",
    """
W = model.W.detach().double()
unit = W / W.norm(dim=0, keepdim=True).clamp_min(1e-12)
cos = unit.T @ unit
left, groups = set(represented), []
while left:
    stack, comp = [min(left)], set()
    while stack:
        i = stack.pop()
        if i in comp:
            continue
        comp.add(i)
        stack.extend(j for j in left if j not in comp and abs(float(cos[i, j])) >= 0.2)
    left -= comp
    if len(comp) >= 2:
        groups.append(sorted(comp))
answer = {"represented": represented, "groups": sorted(groups)}
print(json.dumps(answer))
""",
)
