"""Reference solution: single-head ablations find the members; a member's backup is the member whose
direct contribution to the target logit grows when that member is ablated."""

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
    out = {}
    store = {}
    def grab(result, hook):
        store[hook.layer()] = result[:, -1].detach()
    hooks = zero_heads(ablated) + [(lambda name: name.endswith("hook_result"), grab)]
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    for layer, head in members:
        contrib = store[layer][:, head] @ model.W_U.detach()
        out[(layer, head)] = float(contrib[rows, targets].mean())
    return out

base = dla([])
roles = {}
for x in members:
    after = dla([x])
    for y in members:
        if y != x and after[y] - base[y] >= 0.1 * clean:
            roles[f"L{x[0]}H{x[1]}"] = "primary"
            roles[f"L{y[0]}H{y[1]}"] = "backup"
for layer, head in members:
    roles.setdefault(f"L{layer}H{head}", "primary")
answer = {"heads": [[l, h] for l, h in members], "roles": roles}
print(json.dumps(answer))
""",
)
