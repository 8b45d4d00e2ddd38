"""Reference solution: zero-ablate each head's output (hook_z) and measure the margin drop."""

SNIPPETS = (
    """
print(model.cfg)
with torch.no_grad():
    logits = model(tokens)[:, -1]
tgt = logits.gather(1, targets[:, None])[:, 0]
masked = logits.clone()
masked[torch.arange(len(targets)), targets] = -1e9
clean = float((tgt - masked.max(dim=1).values).mean())
print("clean margin", round(clean, 3))
""",
    """
def mean_margin(lg):
    lg = lg[:, -1]
    t = lg.gather(1, targets[:, None])[:, 0]
    o = lg.clone()
    o[torch.arange(len(targets)), targets] = -1e9
    return float((t - o.max(dim=1).values).mean())

drops = {}
for layer in range(model.cfg.n_layers):
    for head in range(model.cfg.n_heads):
        def zero_head(z, hook, h=head):
            z[:, :, h] = 0.0
            return z
        with torch.no_grad():
            lg = model.run_with_hooks(tokens, fwd_hooks=[(utils.get_act_name("z", layer), zero_head)])
        drops[(layer, head)] = clean - mean_margin(lg)
ranked = sorted(drops, key=lambda k: -drops[k])
print([(k, round(drops[k], 3)) for k in ranked[:5]])
""",
    """
best = drops[ranked[0]]
answer = [[k[0], k[1]] for k in ranked if drops[k] >= 0.5 * best]
print(json.dumps(answer))
""",
)
