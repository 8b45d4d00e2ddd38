"""Friction across families: code written as interpretability researchers write it (TransformerLens demos,
ARENA-style exercises, activation patching and ablation loops, einops reshapes, factored-matrix analyses) runs
on every transformer family at every level (attention-only or with MLPs, different widths, contexts and probe
sets). Two kinds, at least 120 together: ``SNIPPETS`` check their own result with ``assert`` and print ``ok``;
``CASES`` are short cells whose printed output must contain a stated text, with the instance's sizes filled in
(``facts``). A failure shows the sandbox's one-line error, which names the missing call.
"""

from __future__ import annotations

from string import Template

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
    model.blocks[-1].attn.W_O.mul_(0.0)
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
    "logit-lens": """
_, cache = model.run_with_cache(tokens)
resids, labels = cache.accumulated_resid(pos_slice=-1, return_labels=True)
lens = resids @ model.W_U + model.b_U
assert lens.shape == (model.cfg.n_layers + 1, tokens.shape[0], model.cfg.d_vocab)
assert torch.allclose(lens[-1], model(tokens)[:, -1], atol=1e-3) and labels[0] == '0_pre'
print('ok')""",
    "induction-score-on-repeated-tokens": """
half = model.cfg.n_ctx // 2
torch.manual_seed(0)
r = torch.randint(0, model.cfg.d_vocab, (8, half))
rep = torch.cat([r, r], dim=1)
_, cache = model.run_with_cache(rep)
scores = torch.stack([cache['pattern', l].diagonal(offset=1 - half, dim1=-2, dim2=-1).mean((0, -1))
                      for l in range(model.cfg.n_layers)])
assert scores.shape == (model.cfg.n_layers, model.cfg.n_heads) and bool(((scores >= 0) & (scores <= 1)).all())
print('ok')""",
    "attention-entropy": """
_, cache = model.run_with_cache(tokens)
p = cache['pattern', 0]
entropy = -(p * torch.log(p + 1e-12)).sum(-1).mean((0, 2))
assert entropy.shape == (model.cfg.n_heads,) and bool((entropy >= -1e-5).all())
print('ok')""",
    "ov-copying-scores": """
full = model.W_E @ model.OV @ model.W_U
ev = full.eigenvalues
score = ev.real.sum(-1) / ev.abs().sum(-1).clamp_min(1e-9)
assert score.shape == (model.cfg.n_layers, model.cfg.n_heads) and bool((score.abs() <= 1 + 1e-4).all())
print('ok')""",
    "k-composition-scores": """
def comp(a, b):
    return (a @ b).norm() / (a.norm() * b.norm())
H = model.cfg.n_heads
src = 1 if float(model.blocks[0].attn.W_O.abs().sum()) == 0 else 0  # head-roles: block 0's attention is off
kc = torch.zeros(H, H)
for h0 in range(H):
    ov = model.OV[src, h0].AB
    for h1 in range(H):
        kc[h0, h1] = comp(ov, model.QK[src + 1, h1].AB.T)
assert kc.shape == (H, H) and bool(torch.isfinite(kc).all()) and bool((kc >= 0).all())
print('ok')""",
    "path-patching-one-head": """
corrupted = tokens.roll(1, dims=0)
_, corrupted_cache = model.run_with_cache(corrupted)
layer, head = model.cfg.n_layers - 1, 0
def patch_head(z, hook):
    z[:, :, head] = corrupted_cache[hook.name][:, :, head]
    return z
patched = model.run_with_hooks(tokens, fwd_hooks=[(utils.get_act_name('z', layer), patch_head)])
clean = model(tokens)
assert patched.shape == clean.shape and not torch.equal(patched, model(corrupted))
print('ok')""",
    "causal-tracing-grid": """
corrupted = tokens.flip(0)
_, clean_cache = model.run_with_cache(tokens)
clean = model(tokens)[:, -1]
L, P = model.cfg.n_layers, tokens.shape[1]
effects = torch.zeros(L, P)
for layer in range(L):
    for pos in range(P):
        def restore(resid, hook, pos=pos):
            resid[:, pos] = clean_cache[hook.name][:, pos]
            return resid
        out = model.run_with_hooks(corrupted, fwd_hooks=[(utils.get_act_name('resid_pre', layer), restore)])
        effects[layer, pos] = (out[:, -1] - clean).abs().mean()
assert bool(torch.isfinite(effects).all()) and bool((effects >= 0).all())
print('ok')""",
    "zero-ablate-attention-layer": """
zero = lambda x, hook: torch.zeros_like(x)
ablated = model.run_with_hooks(tokens, fwd_hooks=[('blocks.0.hook_attn_out', zero)])
with model.hooks(fwd_hooks=[('blocks.0.hook_attn_out', zero)]):
    logits, cache = model.run_with_cache(tokens)
assert torch.allclose(logits, ablated, atol=1e-4) and float(cache['attn_out', 0].abs().max()) == 0.0
print('ok')""",
    "pattern-from-queries-and-keys": """
import einops
_, cache = model.run_with_cache(tokens)
q, k = cache['q', 0], cache['k', 0]
scores = einops.einsum(q, k, 'b q h d, b k h d -> b h q k') / model.cfg.d_head ** 0.5
P = tokens.shape[1]
future = torch.triu(torch.ones(P, P, dtype=torch.bool), diagonal=1)
pattern = scores.masked_fill(future, float('-inf')).softmax(-1)
assert torch.allclose(pattern, cache['pattern', 0], atol=1e-4)
assert torch.allclose(scores.masked_fill(future, float('-inf')), cache['attn_scores', 0])
print('ok')""",
    "zeroed-queries-attend-uniformly": """
def no_query(q, hook):
    q[:, :, 0] = 0.0
    return q
with model.hooks(fwd_hooks=[('blocks.0.attn.hook_q', no_query)]):
    _, cache = model.run_with_cache(tokens[:2])
P = tokens.shape[1]
uniform = torch.tril(torch.ones(P, P)) / torch.arange(1, P + 1)[:, None]
assert torch.allclose(cache['pattern', 0][:, 0], uniform.expand(2, P, P), atol=1e-5)
print('ok')""",
    "loss-by-hand": """
logits = model(tokens)
V = model.cfg.d_vocab
by_hand = F.cross_entropy(logits[:, :-1].reshape(-1, V), tokens[:, 1:].reshape(-1))
assert torch.allclose(by_hand, model(tokens, return_type='loss'), atol=1e-5)
per_token = model(tokens, return_type='loss', loss_per_token=True)
assert per_token.shape == (tokens.shape[0], tokens.shape[1] - 1)
print('ok')""",
    "numpy-argmax-of-mean-pattern": """
_, cache = model.run_with_cache(tokens)
mean = cache['pattern', 0].mean(0).numpy()
h, q, k = np.unravel_index(mean.argmax(), mean.shape)
assert k <= q and 0 <= h < model.cfg.n_heads
print('ok')""",
    "remove-batch-dim": """
_, cache = model.run_with_cache(tokens[:1])
single = cache.remove_batch_dim()
assert single['pattern', 0].shape == (model.cfg.n_heads, tokens.shape[1], tokens.shape[1])
assert torch.equal(single['resid_post', 0], cache['resid_post', 0][0])
print('ok')""",
    "per-head-results": """
_, cache = model.run_with_cache(tokens)
result = cache['result', 0]
assert result.shape == (tokens.shape[0], tokens.shape[1], model.cfg.n_heads, model.cfg.d_model)
assert torch.allclose(result.sum(2) + model.b_O[0], cache['attn_out', 0], atol=1e-3)
print('ok')""",
    "config-reads": """
cfg = model.cfg
assert cfg.d_model == model.W_E.shape[1] and cfg.d_vocab == model.W_U.shape[1] and cfg.n_ctx == model.W_pos.shape[0]
assert cfg.to_dict()['n_heads'] == cfg.n_heads and cfg.normalization_type is None
print('ok')""",

}



CASES = [  # (snippet, the text its output must contain; $names are the instance's facts(), below)
    ("print(model.W_Q.shape)", "torch.Size([$L, $H, $D, $dh])"),
    ("print(model.cfg.n_layers, model.cfg.n_heads)", "$L $H"),
    ("print(model.cfg)", "HookedConfig("),
    ("logits = model(tokens)\nprint(logits.shape)", "torch.Size([$N, $P, $V])"),
    ("with torch.no_grad():\n    out = model(tokens[:2])\nprint(out.shape[0])", "2"),
    ("x = 3.14159\nprint(f'{x:.2f} {x!r}')", "3.14 3.14159"),
    ("print([i * i for i in range(4)], {k: v for k, v in zip('ab', [1, 2])})", "[0, 1, 4, 9] {'a': 1, 'b': 2}"),
    ("n = sum(p.numel() for n_, p in model.named_parameters())\nprint(n > 0)", "True"),
    ("for name, p in model.named_parameters():\n    print(name, tuple(p.shape))\n    break", "embed.W_E"),
    (
        "seen = []\ndef hook(module, inputs, output):\n    seen.append(output.shape)\n"
        "h = model.blocks[0].attn.hook_z.register_forward_hook(hook)\nmodel(tokens)\nh.remove()\nprint(len(seen))",
        "1",
    ),
    ("logits, cache = model.run_with_cache(tokens)\nprint(cache['pattern', 0].shape)", "torch.Size([$N, $H, $P, $P])"),
    ("logits, cache = model.run_with_cache(tokens)\nprint(cache['blocks.1.attn.hook_z'].shape)", "[$N, $P, $H, $dh]"),
    (
        "names = []\ndef grab(z, hook):\n    names.append(hook.name)\n    return z\n"
        "model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith('hook_z'), grab)])\nprint(names)",
        "blocks.0.attn.hook_z",
    ),
    ("print(utils.get_act_name('pattern', 1))", "blocks.1.attn.hook_pattern"),
    ("print(model.OV)", "FactoredMatrix: shape ($L, $H, $D, $D), inner dim $dh"),
    ("print(model.to_str_tokens(tokens[0])[:3], len(model.to_str_tokens(tokens[:2])))", "['t"),
    ("text = model.to_string(tokens[0])\nprint(torch.equal(model.to_tokens(text)[0], tokens[0]), text[:1])", "True t"),
    (
        "print(model.tokenizer.decode([3, 17]), model.tokenizer.encode('t3 t17'), model.to_tokens('t1 t2').shape)",
        "t3 t17 [3, 17] torch.Size([1, 2])",
    ),
    (
        "out = model.generate(tokens[0, :6], max_new_tokens=3)\n"
        "print(out.shape, torch.equal(out[0, :6], tokens[0, :6]))",
        "torch.Size([1, 9]) True",
    ),
    ("print(len(model.generate('t1 t2 t3', max_new_tokens=2).split()))", "5"),
    (  # attribution patching: gradients on an activation, the weights left frozen
        "saved = {}\ndef keep(z, hook):\n    z.requires_grad_(True)\n    saved['z'] = z\n    return z\n"
        "out = model.run_with_hooks(tokens[:4], fwd_hooks=[('blocks.0.attn.hook_z', keep)])\n"
        "out[:, -1].sum().backward()\nprint(tuple(saved['z'].grad.shape), model.W_E.grad is None)",
        "(4, $P, $H, $dh) True",
    ),
    (  # gradients on the weights, as the prompt says
        "model.requires_grad_(True)\nmodel(tokens[:4])[:, -1].sum().backward()\n"
        "print(model.W_E.grad.abs().sum() > 0)\nreset_model()\nprint(model.W_E.requires_grad)",
        "tensor(True)\nFalse",
    ),
    (
        "U, S, Vh = model.OV[1, 3].svd()\n"
        "print(torch.allclose(U @ torch.diag(S) @ Vh.T, model.OV[1, 3].AB, atol=1e-4))",
        "True",
    ),
    (
        "full = model.W_E @ model.OV @ model.W_U\nprint(tuple(full.AB.shape), tuple(full.S.shape))",
        "($L, $H, $V, $V) ($L, $H, $S)",
    ),
    ("ev = model.OV[0, 0].eigenvalues\nprint(ev.shape, ev.dtype)", "torch.Size([$dh]) torch.complex64"),
    (
        "print(torch.allclose(model.QK.AB, model.W_Q @ model.W_K.transpose(-2, -1), atol=1e-5), model.QK.T.ndim)",
        "True 4",
    ),
    (
        "logits, cache = model.run_with_cache(tokens)\nstack, labels = cache.decompose_resid(return_labels=True)\n"
        "last = tokens[:, -1]\nattrs = cache.logit_attrs(stack, last, pos_slice=-1)\n"
        "total = attrs.sum(0) + model.b_U[last]\n"
        "print(labels, torch.allclose(total, logits[torch.arange(len(last)), -1, last], atol=1e-3))",
        "$labels True",
    ),
    (
        "logits, cache = model.run_with_cache(tokens)\nheads, labels = cache.stack_head_results(return_labels=True)\n"
        "print(torch.equal(cache.apply_ln_to_stack(heads, layer=-1), heads), labels[:2])",
        "True ['L0H0', 'L0H1']",
    ),
    ("from transformer_lens import utils as tl\nprint(tl.get_act_name('resid_pre', 1))", "blocks.1.hook_resid_pre"),
    ("import transformer_lens\nprint(transformer_lens.utils.get_act_name('z', 0))", "blocks.0.attn.hook_z"),
    ("import transformer_lens.utils as U\nprint(U.get_act_name('pattern', 0))", "blocks.0.attn.hook_pattern"),
    ("from transformer_lens.utils import get_act_name\nprint(get_act_name('q', 1))", "blocks.1.attn.hook_q"),
    (
        "import einops\nlogits, cache = model.run_with_cache(tokens)\n"
        "z = einops.rearrange(cache['z', 0], 'b p h d -> b p (h d)')\nprint(tuple(z.shape))",
        "($N, $P, $HD)",
    ),
    ("from einops import reduce\nprint(tuple(reduce(model.W_Q, 'l h d e -> l h', 'max').shape))", "($L, $H)"),
    ("from einops import repeat\nprint(tuple(repeat(tokens[0], 'p -> b p', b=3).shape))", "(3, $P)"),
    (
        "import einops\nprint(tuple(einops.einsum(model.W_Q, model.W_K, 'l h d e, l h f e -> l h d f').shape))",
        "($L, $H, $D, $D)",
    ),
    (
        "from einops import pack, unpack\npacked, ps = pack([model.W_E, model.W_pos], '* d')\n"
        "a, b = unpack(packed, ps, '* d')\nprint(torch.equal(a, model.W_E), tuple(packed.shape))",
        "True ($VC, $D)",
    ),
    ("W = torch.fft.rfft(model.W_E, dim=0)\nprint(W.abs().shape[0])", "$Vr"),
    ("U, S, V = torch.linalg.svd(model.W_E)\nprint(S.shape)", "torch.Size([$V])"),
    (
        "w = torch.zeros(3, requires_grad=True)\nopt = torch.optim.SGD([w], lr=0.5)\nfor _ in range(20):\n"
        "    opt.zero_grad()\n    loss = ((w - 2) ** 2).sum()\n    loss.backward()\n    opt.step()\n"
        "print(round(float(w[0]), 2))",
        "2.0",
    ),
    (
        "x = torch.ones(2, requires_grad=True)\ng, = torch.autograd.grad((x ** 3).sum(), x)\nprint(g.tolist())",
        "[3.0, 3.0]",
    ),
    ("import torch.nn.functional as G\nprint(G.relu(torch.tensor([-1.0, 2.0])).tolist())", "[0.0, 2.0]"),
    ("from torch import nn as N\nprint(N.Linear(2, 3))", "Linear(in_features=2, out_features=3"),
    ("from torch.nn import functional\nprint(functional.softmax(torch.zeros(2), dim=0).tolist())", "[0.5, 0.5]"),
    ("print(model.W_E.numpy().shape)", "($V, $D)"),
    ("print(np.asarray(model.W_E).shape)", "($V, $D)"),
    ("W = model.W_E.clone()\nW[:, 3] = 0\nprint(float(W[:, 3].abs().sum()))", "0.0"),
    ("W = model.W_E.clone()\nW[:, 3] *= 0\nprint(float(W[:, 3].abs().sum()))", "0.0"),
    ("m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())\nm.act = nn.Identity()\nprint(m.act)", "Identity()"),
    (
        "class Counter:\n    def __init__(self):\n        self.n = 0\n    def inc(self):\n        self.n += 1\n"
        "c = Counter()\nc.inc()\nc.inc()\nprint(c.n)",
        "2",
    ),
    ("print(sorted([3, 1, 2], reverse=True), list(enumerate('ab')))", "[3, 2, 1] [(0, 'a'), (1, 'b')]"),
    ("print(getattr(model, 'cfg').d_model)", "$D"),
    ("shape = (2, 3)\nprint(torch.zeros(*shape).shape)", "torch.Size([2, 3])"),
    ("print(type(model.W_E[0] + 1))", "<class 'torch.Tensor'>"),
    ("print(type(3) == int, isinstance(model.W_E, type(model.W_E)))", "True True"),
    ("print('run_with_cache' in dir(model))", "True"),
    ("help(model.run_with_cache)", "cache"),
    ("print('{:.3f} {}'.format(2.0, 'x'))", "2.000 x"),
    ("torch.manual_seed(0)\na = torch.rand(2)\ntorch.manual_seed(0)\nprint(bool((a == torch.rand(2)).all()))", "True"),
    ("import random\nrandom.seed(1)\nx = random.random()\nrandom.seed(1)\nprint(x == random.random())", "True"),
    (
        "class Tiny(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = nn.Linear(2, 1)\n    def forward(self, x):\n        return self.lin(x)\n"
        "print(Tiny()(torch.ones(3, 2)).shape)",
        "torch.Size([3, 1])",
    ),
    ("import math\nprint(math.sqrt(16), math.pi > 3)", "4.0 True"),
    ("import itertools\nprint(list(itertools.combinations(range(3), 2)))", "[(0, 1), (0, 2), (1, 2)]"),
    ("from collections import Counter\nprint(Counter('aab').most_common(1))", "[('a', 2)]"),
    ("import functools\nprint(functools.reduce(lambda a, b: a * b, [1, 2, 3, 4]))", "24"),
    ("import statistics\nprint(statistics.mean([1, 2, 3]))", "2"),
    ("import heapq\nprint(heapq.nlargest(2, [5, 1, 7]))", "[7, 5]"),
    ("import json\nprint(json.dumps({'a': [1, 2]}))", '{"a": [1, 2]}'),
    ("x = 5\nx += 2\nx *= 3\nprint(x)", "21"),
    ("a, b = model.W_E.shape\nprint(a, b)", "$V $D"),
    ("print(torch.special.expit(torch.tensor(0.0)).item())", "0.5"),
    ("print(np.linalg.norm(np.ones(4)), np.fft.rfft(np.ones(4)).shape)", "2.0 (3,)"),
    ("print(torch.topk(torch.tensor([1.0, 5.0, 3.0]), 2).indices.tolist())", "[1, 2]"),
    ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    print('caught', e)", "caught division by zero"),
    ("gen = (i for i in range(3))\nprint(sum(gen))", "3"),
    ("d = {}\nd['k'] = [1]\nd['k'].append(2)\nprint(d)", "{'k': [1, 2]}"),
    ("f = lambda t: t.mean().item()\nprint(round(f(torch.ones(3)), 1))", "1.0"),
    ("if (n := len(tokens)) > 0:\n    print('n', n)", "n $N"),
    ("print(torch.einsum('ij,jk->ik', torch.eye(2), torch.ones(2, 2)).sum().item())", "4.0"),
    ("print((model.W_E @ model.W_E.T).shape)", "torch.Size([$V, $V])"),
    ("x = torch.tensor([1.0]).new_ones(2)\nprint(x.tolist(), x.dtype == torch.float32)", "[1.0, 1.0] True"),
    ("print(torch.tensor([1, 2]).float().mean())", "tensor(1.5000)"),
]


def facts(inst) -> dict[str, str]:
    """What a CASES output names, for one instance: sizes from its config and probe batch."""
    cfg, (n, p) = inst.model.cfg, inst.probe["tokens"].shape
    parts = ("attn_out",) if cfg.attn_only else ("attn_out", "mlp_out")
    labels = ["embed", "pos_embed"] + [f"{layer}_{part}" for layer in range(cfg.n_layers) for part in parts]
    return {"L": cfg.n_layers, "H": cfg.n_heads, "D": cfg.d_model, "dh": cfg.d_head, "V": cfg.d_vocab, "N": n,
            "P": p, "HD": cfg.n_heads * cfg.d_head, "S": min(cfg.d_head, cfg.d_vocab), "VC": cfg.d_vocab + cfg.n_ctx,
            "Vr": cfg.d_vocab // 2 + 1, "labels": str(labels)}  # fmt: skip


@pytest.fixture(scope="module", params=[(f, lv) for f in FAMILIES for lv in LEVELS], ids=lambda p: f"{p[0]}-{p[1]}")
def session(request):
    task_id, level = request.param
    inst = cached_instance(task_id, 0, level)
    s = shared_pool().open_session(ModelPayload.from_instance(inst))
    s.instance = inst  # for facts(): the sizes a CASES output names
    yield s
    s.close()


def test_every_transformer_family_is_covered() -> None:
    assert {"copy-head", "induction-circuit", "committee-circuit", "head-roles", "fact-storage"} <= set(FAMILIES)
    assert len(SNIPPETS) + len(CASES) >= 120  # each runs on every transformer family at every level


@pytest.mark.parametrize("name", list(SNIPPETS))
def test_researcher_snippet_runs(session, name: str) -> None:
    result = session.run(SNIPPETS[name])
    assert result.error is None, f"{name}: {result.error}"
    assert result.stdout.strip().endswith("ok"), f"{name}: {result.stdout[-300:]}"


@pytest.mark.parametrize(("code", "expected"), CASES, ids=[f"c{i}" for i in range(len(CASES))])
def test_snippet_prints_what_python_would(session, code: str, expected: str) -> None:
    want = Template(expected).substitute(facts(session.instance))
    result = session.run(code)
    assert result.error is None, result.error
    assert want in result.stdout, f"expected {want!r} in {result.stdout[-300:]!r}"
