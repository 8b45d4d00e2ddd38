"""Reference solution: causal tracing. Corrupt the subject (the given corrupted prompts, or random
subject tokens), restore each MLP output at each position, and answer the cell that recovers most."""

SNIPPETS = (
    """
N_SUBJ = 16  # subject token ids are 0..15 (stated in the prompt)
attr_lo = int(model.cfg.d_vocab) - 8
def m_of(logits):
    a = logits[:, -1, attr_lo:]
    return float((a.gather(1, (targets - attr_lo)[:, None])[:, 0] - a.mean(dim=1)).mean())
try:
    corrupt = corrupted_tokens
except NameError:
    g = torch.Generator().manual_seed(0)
    corrupt = torch.where(tokens < N_SUBJ, torch.randint(0, N_SUBJ, tokens.shape, generator=g), tokens)
with torch.no_grad():
    clean_logits, cache = model.run_with_cache(tokens)
    m_clean, m_corrupt = m_of(clean_logits), m_of(model(corrupt))
print(tuple(tokens.shape), round(m_clean, 3), round(m_corrupt, 3))
""",
    """
L, T = model.cfg.n_layers, tokens.shape[1]
rec = torch.zeros(L, T)
for layer in range(L):
    name = utils.get_act_name("mlp_out", layer)
    for pos in range(T):
        def restore(act, hook, pos=pos, name=name):
            act[:, pos] = cache[name][:, pos]
            return act
        with torch.no_grad():
            m_restored = m_of(model.run_with_hooks(corrupt, fwd_hooks=[(name, restore)]))
        rec[layer, pos] = (m_restored - m_corrupt) / (m_clean - m_corrupt)
best = int(rec.argmax())
print([[round(float(x), 2) for x in row] for row in rec])
answer = {"layer": best // T, "position": best % T}
print(json.dumps(answer))
""",
)
