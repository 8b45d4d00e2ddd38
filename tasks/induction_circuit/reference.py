"""Reference solution: ablation sweep for the circuit, attention-pattern scores for the roles."""

SNIPPETS = (
    """
print(model.cfg)
half = tokens.shape[1] // 2
def score(lg):
    lg = lg[:, half:-1]
    nxt = tokens[:, half + 1:]
    t = lg.gather(2, nxt[..., None])[..., 0]
    o = lg.clone()
    o.scatter_(2, nxt[..., None], -1e9)
    return float((t - o.max(dim=2).values).mean())
with torch.no_grad():
    clean = score(model(tokens))
print("clean margin", round(clean, 3))
""",
    """
drops = {}
for layer in range(model.cfg.n_layers):
    for head in range(model.cfg.n_heads):
        def zero_head(z, hook, h=head):
            z[:, :, h] = 0.0
            return z
        with torch.no_grad():
            lg = model.run_with_hooks(tokens, fwd_hooks=[(utils.get_act_name("z", layer), zero_head)])
        drops[(layer, head)] = clean - score(lg)
ranked = sorted(drops, key=lambda k: -drops[k])
print([(k, round(drops[k], 3)) for k in ranked[:6]])
circuit = [k for k in ranked if drops[k] >= 0.3 * drops[ranked[0]]]
""",
    """
with torch.no_grad():
    _, cache = model.run_with_cache(tokens)
n = tokens.shape[1]
roles = {}
for layer, head in circuit:
    pat = cache["pattern", layer][:, head]
    prev_score = float(torch.stack([pat[:, i, i - 1] for i in range(1, n)]).mean())
    ind_score = float(torch.stack([pat[:, i, i - half + 1] for i in range(half, n)]).mean())
    roles[f"L{layer}H{head}"] = "induction" if ind_score > prev_score else "previous-token"
    print(layer, head, round(prev_score, 3), round(ind_score, 3))
answer = {"heads": [[l, h] for l, h in circuit], "roles": roles}
print(json.dumps(answer))
""",
)
