"""Friction across families: code written as interpretability researchers write it (TransformerLens demos,
ARENA-style exercises, activation patching and ablation loops, einops reshapes, factored-matrix analyses) runs
on every transformer family at every level. Each snippet checks its own result with ``assert`` and prints
``ok``; a failure shows the sandbox's one-line error, which names the missing call.

Why generic snippets: tests/test_sandbox_friction.py pins exact outputs on one model; these prove the same
calls work on every architecture variant the transformer families ship (attention-only or with MLPs,
different widths, contexts and probe sets).
"""

from __future__ import annotations

import pytest
from helpers import cached_instance, shared_pool
from mechsandbox.arch import HookedTransformer
from mechsandbox.server.sandbox import ModelPayload
from mechsandbox.tasks import LEVELS, families

FAMILIES = [f.id for f in families() if isinstance(cached_instance(f.id, 0, "easy").model, HookedTransformer)]

SNIPPETS = {
    "cache-shapes": """
logits, cache = model.run_with_cache(tokens)
n, p = tokens.shape
assert logits.shape == (n, p, model.cfg.d_vocab)
assert cache['pattern', 0].shape == (n, model.cfg.n_heads, p, p)
assert cache['z', model.cfg.n_layers - 1].shape == (n, p, model.cfg.n_heads, model.cfg.d_head)
assert cache['resid_post', -1].shape == (n, p, model.cfg.d_model)
print('ok')""",
    "pattern-rows-sum-to-one": """
_, cache = model.run_with_cache(tokens)
for layer in range(model.cfg.n_layers):
    rows = cache['pattern', layer].sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-4)
print('ok')""",
    "previous-token-scores": """
_, cache = model.run_with_cache(tokens)
scores = torch.stack([cache['pattern', l].diagonal(offset=-1, dim1=-2, dim2=-1).mean((0, -1))
                      for l in range(model.cfg.n_layers)])
assert scores.shape == (model.cfg.n_layers, model.cfg.n_heads) and bool((scores >= 0).all())
print('ok')""",
    "head-ablation-loop": """
clean = model(tokens)
effects = torch.zeros(model.cfg.n_layers, model.cfg.n_heads)
for layer in range(model.cfg.n_layers):
    for head in range(model.cfg.n_heads):
        def ablate(z, hook, head=head):
            z[:, :, head, :] = 0.0
            return z
        out = model.run_with_hooks(tokens, fwd_hooks=[(utils.get_act_name('z', layer), ablate)])
        effects[layer, head] = (out - clean).abs().mean()
assert effects.shape == (model.cfg.n_layers, model.cfg.n_heads) and torch.isfinite(effects).all()
print('ok')""",
    "activation-patching": """
corrupted = tokens[torch.randperm(tokens.shape[0], generator=torch.Generator().manual_seed(0))]
_, clean_cache = model.run_with_cache(tokens)
def patch(z, hook):
    return clean_cache[hook.name]
patched = model.run_with_hooks(corrupted, fwd_hooks=[(f'blocks.{model.cfg.n_layers - 1}.hook_resid_post', patch)])
assert torch.allclose(patched, model(tokens), atol=1e-4)
print('ok')""",
    "hooks-context": """
seen = []
with model.hooks(fwd_hooks=[(lambda name: name.endswith('hook_pattern'), lambda x, hook: seen.append(hook.layer()))]):
    model(tokens[:2])
model(tokens[:2])
assert seen == list(range(model.cfg.n_layers))
print('ok')""",
    "add-and-reset-hooks": """
hits = []
model.add_hook('blocks.0.hook_resid_pre', lambda x, hook: hits.append(1))
model(tokens[:1])
model.reset_hooks()
model(tokens[:1])
assert hits == [1]
print('ok')""",
    "reset-model": """
clean = model(tokens[:3])
with torch.no_grad():
    model.blocks[0].attn.W_O.mul_(0.0)
assert not torch.equal(model(tokens[:3]), clean)
reset_model()
assert torch.equal(model(tokens[:3]), clean)
print('ok')""",
    "einops-reshapes": """
import einops
_, cache = model.run_with_cache(tokens)
z = cache['z', 0]
flat = einops.rearrange(z, 'b p h d -> b p (h d)')
assert flat.shape[-1] == model.cfg.n_heads * model.cfg.d_head
back = einops.rearrange(flat, 'b p (h d) -> b p h d', h=model.cfg.n_heads)
assert torch.equal(back, z)
mean_pattern = einops.reduce(cache['pattern', 0], 'b h q k -> h q k', 'mean')
assert mean_pattern.shape[0] == model.cfg.n_heads
print('ok')""",
    "einsum-head-outputs": """
import einops
_, cache = model.run_with_cache(tokens)
z = cache['z', 0]
out = einops.einsum(z, model.W_O[0], 'b p h d, h d m -> b p h m')
assert torch.allclose(out.sum(2) + model.b_O[0], cache['attn_out', 0], atol=1e-3)
print('ok')""",
    "factored-ov-svd": """
ov = model.OV
U, S, Vh = ov[0, 0].svd()
assert torch.allclose(U @ torch.diag(S) @ Vh.T, ov[0, 0].AB, atol=1e-3)
full = model.W_E @ model.OV @ model.W_U
assert full.AB.shape[-2:] == (model.cfg.d_vocab, model.cfg.d_vocab)
print('ok')""",
    "qk-eigenvalues": """
ev = (model.W_E @ model.QK[0, 0] @ model.W_E.T).eigenvalues
assert ev.shape[-1] == model.cfg.d_head and ev.is_complex()
print('ok')""",
    "direct-logit-attribution": """
logits, cache = model.run_with_cache(tokens)
stack = cache.decompose_resid()
last = tokens[:, -1]
attrs = cache.logit_attrs(stack, last, pos_slice=-1)
total = attrs.sum(0) + model.b_U[last]
assert torch.allclose(total, logits[torch.arange(tokens.shape[0]), -1, last], atol=1e-3)
print('ok')""",
    "head-results-stack": """
_, cache = model.run_with_cache(tokens)
heads, labels = cache.stack_head_results(return_labels=True, incl_remainder=True)
assert len(labels) == model.cfg.n_layers * model.cfg.n_heads + 1
assert torch.allclose(heads.sum(0), cache['resid_post', -1], atol=1e-3)
assert torch.equal(cache.apply_ln_to_stack(heads, layer=-1), heads)
print('ok')""",
    "accumulated-resid": """
_, cache = model.run_with_cache(tokens)
acc, labels = cache.accumulated_resid(return_labels=True)
assert acc.shape[0] == len(labels) and labels[-1] == 'final_post'
print('ok')""",
    "attribution-patching-gradients": """
saved = {}
def keep(z, hook):
    if not z.requires_grad:  # the first hooked activation is a leaf; later ones depend on it
        z.requires_grad_(True)
    z.retain_grad()
    saved[hook.name] = z
    return z
out = model.run_with_hooks(tokens[:8], fwd_hooks=[(lambda n: n.endswith('hook_z'), keep)])
out[:, -1].logsumexp(-1).sum().backward()
assert len(saved) == model.cfg.n_layers and all(z.grad is not None for z in saved.values())
print('ok')""",
    "strings-round-trip": """
text = model.to_string(tokens[0])
assert torch.equal(model.to_tokens(text)[0], tokens[0])
assert model.to_str_tokens(tokens[0])[0] == f't{int(tokens[0, 0])}'
print('ok')""",
    "greedy-generate": """
prefix = tokens[0, :4]
out = model.generate(prefix, max_new_tokens=2)
assert out.shape == (1, 6) and torch.equal(out[0, :4], prefix)
print('ok')""",
    "weights-by-layer-and-head": """
with torch.no_grad():
    norms = torch.stack([model.W_Q[l].norm(dim=(-2, -1)) for l in range(model.cfg.n_layers)])
assert norms.shape == (model.cfg.n_layers, model.cfg.n_heads)
assert model.W_Q[0, 0].shape == (model.cfg.d_model, model.cfg.d_head)
print('ok')""",
    "imports-by-reflex": """
from transformer_lens import utils as tl_utils
import transformer_lens.utils
import einops, numpy as np, torch.nn.functional as F
assert tl_utils.get_act_name('pattern', 0) == 'blocks.0.attn.hook_pattern'
assert np.asarray(tl_utils.to_numpy(tokens)).shape == tuple(tokens.shape)
print('ok')""",
    "introspection": """
mine = 1
assert 'mine' in dir() and 'model' in globals()
try:
    model.to_tokens('t999999')
except Exception as e:
    assert type(e).__name__ == 'ValueError' and 'not a token' in str(e)
else:
    raise AssertionError('to_tokens accepted an unknown token')
print('ok')""",
    "loss-and-return-types": """
loss = model(tokens, return_type='loss')
logits, loss2 = model(tokens, return_type='both')
assert loss.dim() == 0 and torch.allclose(loss, loss2)
print('ok')""",
    "names-filter-cache": """
_, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith('hook_pattern'))
assert all(k.endswith('hook_pattern') for k in cache.keys()) and len(cache) == model.cfg.n_layers
print('ok')""",
    "mean-ablation": """
_, cache = model.run_with_cache(tokens)
means = {l: cache['z', l].mean(0, keepdim=True) for l in range(model.cfg.n_layers)}
def mean_ablate(z, hook):
    return means[hook.layer()].expand_as(z)
out = model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith('hook_z'), mean_ablate)])
assert out.shape == (tokens.shape[0], tokens.shape[1], model.cfg.d_vocab)
print('ok')""",
}


@pytest.fixture(scope="module", params=[(f, lv) for f in FAMILIES for lv in LEVELS], ids=lambda p: f"{p[0]}-{p[1]}")
def session(request):
    task_id, level = request.param
    s = shared_pool().open_session(ModelPayload.from_instance(cached_instance(task_id, 0, level)))
    yield s
    s.close()


def test_every_transformer_family_is_covered() -> None:
    assert {"copy-head", "induction-circuit", "committee-circuit", "head-roles", "fact-storage"} <= set(FAMILIES)
    assert len(SNIPPETS) * len(FAMILIES) * len(LEVELS) >= 120 * 3


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_researcher_snippet_runs(session, name: str) -> None:
    result = session.run(SNIPPETS[name])
    assert result.error is None, f"{name}: {result.error}"
    assert result.stdout.strip().endswith("ok"), f"{name}: {result.stdout[-300:]}"
