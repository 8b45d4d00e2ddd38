"""Reference solution: single-head ablations find the primaries (and any backup visible alone); then each
found head is ablated in turn, and a head whose direct contribution to the target logit grows by >= 10%
of the clean margin is that head's backup (hidden backups show only this way)."""

SNIPPETS = (
    """
print(model.cfg)
rows = torch.arange(len(targets))
def mean_margin(lg):
    lg = lg[:, -1]
    t = lg[rows, targets]
    o = lg.clone()
    o[rows, targets] = -1e9
    return float((t - o.max(dim=1).values).mean())
def zero_heads(heads):
    hooks = []
    for layer, head in heads:
        def fn(z, hook, h=head):
            z[:, :, h] = 0.0
            return z
        hooks.append((utils.get_act_name("z", layer), fn))
    return hooks
with torch.no_grad():
    clean = mean_margin(model(tokens))
print("clean margin", round(clean, 3))
""",
    """
drops = {}
for layer in range(model.cfg.n_layers):
    for head in range(model.cfg.n_heads):
        with torch.no_grad():
            lg = model.run_with_hooks(tokens, fwd_hooks=zero_heads([(layer, head)]))
        drops[(layer, head)] = (clean - mean_margin(lg)) / clean
ranked = sorted(drops, key=lambda k: -drops[k])
print([(k, round(drops[k], 3)) for k in ranked[:10]])
members = [k for k in ranked if drops[k] >= 0.075]
""",
    """
def dla(ablated):
    store = {}
    def grab(result, hook):
        store[hook.layer()] = result[:, -1].detach()
    hooks = zero_heads(ablated) + [(lambda name: name.endswith("hook_result"), grab)]
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    return {(layer, head): float((store[layer][:, head] @ model.W_U.detach())[rows, targets].mean())
            for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)}

base = dla([])
roles = {}
for x in members:
    after = dla([x])
    for y in after:
        if y != x and after[y] - base[y] >= 0.1 * clean:
            roles.setdefault(f"L{x[0]}H{x[1]}", "primary")
            roles[f"L{y[0]}H{y[1]}"] = "backup"
for layer, head in members:
    roles.setdefault(f"L{layer}H{head}", "primary")
heads = sorted({(int(k[1:].split("H")[0]), int(k.split("H")[1])) for k in roles})
answer = {"heads": [[l, h] for l, h in heads], "roles": roles}
print(json.dumps(answer))
""",
)
