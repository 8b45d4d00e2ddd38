"""Reference solution: the detection scores of the prompt, computed from cached attention patterns."""

SNIPPETS = (
    """
with torch.no_grad():
    _, cache = model.run_with_cache(tokens)
n, half = tokens.shape[1], tokens.shape[1] // 2
i = torch.arange(n)
s = i[half:]
print(model.cfg.n_layers, model.cfg.n_heads, n)
""",
    """
answer = {}
for layer in range(1, model.cfg.n_layers):  # block 0: an MLP, its attention off
    pat = cache["pattern", layer]
    scores = {
        "previous-token": pat[:, :, i[1:], i[1:] - 1].mean(dim=(0, 2)),
        "duplicate-token": pat[:, :, s, s - half].mean(dim=(0, 2)),
        "induction": pat[:, :, s, s - half + 1].mean(dim=(0, 2)),
        "attend-to-first": pat[:, :, i[1:], 0].mean(dim=(0, 2)),
        "local": (pat[:, :, i[3:], i[3:] - 2] + pat[:, :, i[3:], i[3:] - 3]).mean(dim=(0, 2)),
    }
    for head in range(model.cfg.n_heads):
        best = max(scores, key=lambda r: float(scores[r][head]))
        answer[f"L{layer}H{head}"] = best if float(scores[best][head]) >= 0.4 else "none"
print(json.dumps(answer))
""",
)
