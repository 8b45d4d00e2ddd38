"""Friction suite: what agents naturally write runs in the sandbox and prints what plain Python would.

Each case is (snippet, text its output must contain). They run in one sandbox session per model,
as an agent's cells would, but each snippet is self-contained.
"""

from __future__ import annotations

import pytest
from helpers import cached_instance, shared_pool
from mechsandbox.server.sandbox import ModelPayload

TRANSFORMER_CASES = [
    ("print(model.W_Q.shape)", "torch.Size([2, 12, 106, 16])"),
    ("print(model.cfg.n_layers, model.cfg.n_heads)", "2 12"),
    ("print(model.cfg)", "HookedConfig("),
    ("logits = model(tokens)\nprint(logits.shape)", "torch.Size([96, 12, 32])"),
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
    ("logits, cache = model.run_with_cache(tokens)\nprint(cache['pattern', 0].shape)", "torch.Size([96, 12, 12, 12])"),
    ("logits, cache = model.run_with_cache(tokens)\nprint(cache['blocks.1.attn.hook_z'].shape)", "[96, 12, 12, 16]"),
    (
        "names = []\ndef grab(z, hook):\n    names.append(hook.name)\n    return z\n"
        "model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith('hook_z'), grab)])\nprint(names)",
        "blocks.0.attn.hook_z",
    ),
    ("print(utils.get_act_name('pattern', 1))", "blocks.1.attn.hook_pattern"),
    ("print(model.OV)", "FactoredMatrix: shape (2, 12, 106, 106), inner dim 16"),
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
        "(4, 12, 12, 16) True",
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
        "(2, 12, 32, 32) (2, 12, 16)",
    ),
    ("ev = model.OV[0, 0].eigenvalues\nprint(ev.shape, ev.dtype)", "torch.Size([16]) torch.complex64"),
    (
        "print(torch.allclose(model.QK.AB, model.W_Q @ model.W_K.transpose(-2, -1), atol=1e-5), model.QK.T.ndim)",
        "True 4",
    ),
    (
        "logits, cache = model.run_with_cache(tokens)\nstack, labels = cache.decompose_resid(return_labels=True)\n"
        "attrs = cache.logit_attrs(stack, targets, pos_slice=-1)\n"
        "total = attrs.sum(0) + model.b_U[targets]\n"
        "print(labels, torch.allclose(total, logits[torch.arange(len(targets)), -1, targets], atol=1e-3))",
        "['embed', 'pos_embed', '0_attn_out', '1_attn_out'] True",
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
        "(96, 12, 192)",
    ),
    ("from einops import reduce\nprint(tuple(reduce(model.W_Q, 'l h d e -> l h', 'max').shape))", "(2, 12)"),
    ("from einops import repeat\nprint(tuple(repeat(tokens[0], 'p -> b p', b=3).shape))", "(3, 12)"),
    (
        "import einops\nprint(tuple(einops.einsum(model.W_Q, model.W_K, 'l h d e, l h f e -> l h d f').shape))",
        "(2, 12, 106, 106)",
    ),
    (
        "from einops import pack, unpack\npacked, ps = pack([model.W_E, model.W_pos], '* d')\n"
        "a, b = unpack(packed, ps, '* d')\nprint(torch.equal(a, model.W_E), tuple(packed.shape))",
        "True (44, 106)",
    ),
    ("W = torch.fft.rfft(model.W_E, dim=0)\nprint(W.abs().shape[0])", "17"),
    ("U, S, V = torch.linalg.svd(model.W_E)\nprint(S.shape)", "torch.Size([32])"),
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
    ("print(model.W_E.numpy().shape)", "(32, 106)"),
    ("print(np.asarray(model.W_E).shape)", "(32, 106)"),
    ("W = model.W_E.clone()\nW[:, 3] = 0\nprint(float(W[:, 3].abs().sum()))", "0.0"),
    ("W = model.W_E.clone()\nW[:, 3] *= 0\nprint(float(W[:, 3].abs().sum()))", "0.0"),
    ("m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())\nm.act = nn.Identity()\nprint(m.act)", "Identity()"),
    (
        "class Counter:\n    def __init__(self):\n        self.n = 0\n    def inc(self):\n        self.n += 1\n"
        "c = Counter()\nc.inc()\nc.inc()\nprint(c.n)",
        "2",
    ),
    ("print(sorted([3, 1, 2], reverse=True), list(enumerate('ab')))", "[3, 2, 1] [(0, 'a'), (1, 'b')]"),
    ("print(getattr(model, 'cfg').d_model)", "106"),
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
    ("a, b = model.W_E.shape\nprint(a, b)", "32 106"),
    ("print(torch.special.expit(torch.tensor(0.0)).item())", "0.5"),
    ("print(np.linalg.norm(np.ones(4)), np.fft.rfft(np.ones(4)).shape)", "2.0 (3,)"),
    ("print(torch.topk(torch.tensor([1.0, 5.0, 3.0]), 2).indices.tolist())", "[1, 2]"),
    ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    print('caught', e)", "caught division by zero"),
    ("gen = (i for i in range(3))\nprint(sum(gen))", "3"),
    ("d = {}\nd['k'] = [1]\nd['k'].append(2)\nprint(d)", "{'k': [1, 2]}"),
    ("f = lambda t: t.mean().item()\nprint(round(f(torch.ones(3)), 1))", "1.0"),
    ("if (n := len(tokens)) > 0:\n    print('n', n)", "n 96"),
    ("print(torch.einsum('ij,jk->ik', torch.eye(2), torch.ones(2, 2)).sum().item())", "4.0"),
    ("print((model.W_E @ model.W_E.T).shape)", "torch.Size([32, 32])"),
    ("x = torch.tensor([1.0]).new_ones(2)\nprint(x.tolist(), x.dtype == torch.float32)", "[1.0, 1.0] True"),
    ("print(torch.tensor([1, 2]).float().mean())", "tensor(1.5000)"),
]

MLP_CASES = [
    ("print(model)", "Sequential("),
    ("print(model[0].weight.shape, X.shape)", "torch.Size(["),
    ("print(box)", "[-1.0, 1.0]"),
    ("out = model(X)\nprint(out.shape[0] == X.shape[0])", "True"),
    ("w = model[0].weight.detach().abs().sum(0)\nprint(len(w.argsort().tolist()) == X.shape[1])", "True"),
]


@pytest.fixture(scope="module")
def transformer_session():
    session = shared_pool().open_session(ModelPayload.from_instance(cached_instance("copy-head", 0, "easy")))
    yield session
    session.close()


@pytest.fixture(scope="module")
def mlp_session():
    session = shared_pool().open_session(ModelPayload.from_instance(cached_instance("dead-neurons", 0, "easy")))
    yield session
    session.close()


def test_there_are_at_least_fifty_cases() -> None:
    assert len(TRANSFORMER_CASES) + len(MLP_CASES) >= 50


@pytest.mark.parametrize(("code", "expected"), TRANSFORMER_CASES, ids=[f"t{i}" for i in range(len(TRANSFORMER_CASES))])
def test_transformer_snippet(transformer_session, code: str, expected: str) -> None:
    result = transformer_session.run(code)
    assert result.error is None, result.error
    assert expected in result.stdout, result.stdout


@pytest.mark.parametrize(("code", "expected"), MLP_CASES, ids=[f"m{i}" for i in range(len(MLP_CASES))])
def test_mlp_snippet(mlp_session, code: str, expected: str) -> None:
    result = mlp_session.run(code)
    assert result.error is None, result.error
    assert expected in result.stdout, result.stdout


ECHO_CASES = [  # (snippet, its whole output): a bare last expression echoes like a REPL or notebook cell
    ("model.W_Q.shape", "torch.Size([2, 12, 106, 16])\n"),
    ("n = model.cfg.n_layers\nn + 1", "3\n"),
    ("'abc'", "'abc'\n"),
    ("print(1)", "1\n"),  # print's None is not echoed
    ("x = None\nx", ""),
    ("for i in range(2):\n    i", ""),  # only the snippet's own last statement, not a block's
    ("y = 2\nif y:\n    y", ""),
    ("z = 5", ""),
]


@pytest.mark.parametrize(("code", "output"), ECHO_CASES, ids=[f"e{i}" for i in range(len(ECHO_CASES))])
def test_a_bare_last_expression_echoes_its_value(transformer_session, code: str, output: str) -> None:
    result = transformer_session.run(code)
    assert result.error is None, result.error
    assert result.stdout == output


def test_an_echo_is_cut_and_cannot_be_called_by_name(transformer_session) -> None:
    result = transformer_session.run("list(range(5000))")
    assert result.error is None and result.stdout.endswith("more characters)\n"), result.stdout[-80:]
    assert len(result.stdout) < 4100
    refused = transformer_session.run("_echo_(1)")
    assert refused.error and "starts with" in refused.error and refused.stdout == ""


HOOK_CONTEXT = """
seen = []
def grab(z, hook):
    seen.append(hook.name)
model.add_hook('blocks.1.attn.hook_z', grab)  # added before the block: stays after it
with model.hooks(fwd_hooks=[('blocks.0.attn.hook_z', grab)]) as m:
    m(tokens[:1])
model(tokens[:1])
model.reset_hooks()
model(tokens[:1])
print(seen)
"""


INTROSPECTION_CASES = [  # (snippet, its whole output)
    ("try:\n    1 / 0\nexcept Exception as e:\n    print(type(e).__name__)", "ZeroDivisionError\n"),
    ("print(torch.relu.__name__, type(model.W_E).__name__, np.__name__)", "relu Parameter numpy\n"),
    ("mine = 1\nprint('mine' in dir(), 'model' in dir(), any(n.startswith('_') for n in dir()))", "True True False\n"),
    ("g = globals()\ng['model'] = 3\nprint(type(model).__name__, 'tokens' in g)", "HookedTransformer True\n"),
    ("print(dir(model.cfg)[:2])", "['act_fn', 'attn_only']\n"),
]


@pytest.mark.parametrize(("code", "output"), INTROSPECTION_CASES)
def test_introspection_researchers_write(transformer_session, code: str, output: str) -> None:
    result = transformer_session.run(code)
    assert result.error is None, result.error
    assert result.stdout == output


@pytest.mark.parametrize(
    ("code", "reason"),
    [("np.array([1, 2], dtype=object)", "dtype='O'"), ("open('x')", "files"), ("vars(model)", "dir(x)")],
)
def test_a_refused_builtin_says_why(transformer_session, code: str, reason: str) -> None:
    result = transformer_session.run(code)
    assert result.error and "is refused in the sandbox" in result.error and reason in result.error, result.error


def test_dunder_name_cannot_be_written_or_reach_anything_but_a_string(transformer_session) -> None:
    assert "starts with" in transformer_session.run("model.__name__ = 'x'").error
    result = transformer_session.run("model.W_E.__name__")
    assert result.error and "AttributeError" in result.error and "__name__" in result.error, result.error


def test_an_unknown_einops_reduction_is_one_line(transformer_session) -> None:
    result = transformer_session.run("import einops\neinops.reduce(model.W_E, 'v d -> d', 'tofile')")
    assert result.error and "\n" not in result.error.strip() and "tofile" in result.error, result.error


def test_hooks_context_manager_removes_only_its_own_hooks(transformer_session) -> None:
    result = transformer_session.run(HOOK_CONTEXT)
    assert result.error is None, result.error
    assert result.stdout == "['blocks.0.attn.hook_z', 'blocks.1.attn.hook_z', 'blocks.1.attn.hook_z']\n"


RESET_MODEL = """
clean = model(tokens[:2])
with torch.no_grad():
    model.W_E.mul_(0.0)
model.add_hook('blocks.0.hook_resid_pre', lambda x, hook: x + 1.0)
edited = model(tokens[:2])
old = model
kept = 7
reset_model()
print(torch.equal(model(tokens[:2]), clean), torch.equal(edited, clean), kept, old is model)
"""


def test_reset_model_undoes_weight_edits_and_hooks_and_keeps_the_namespace(transformer_session) -> None:
    result = transformer_session.run(RESET_MODEL)
    assert result.error is None, result.error
    assert result.stdout == "True False 7 False\n"
    again = transformer_session.run("print(kept, torch.equal(model(tokens[:2]), clean))")
    assert again.stdout == "7 True\n", again.stdout + str(again.error)


def test_namespace_persists_between_steps(transformer_session) -> None:
    assert transformer_session.run("kept = 41").error is None
    assert transformer_session.run("print(kept + 1)").stdout == "42\n"


def test_torch_warnings_go_to_the_snippets_output(transformer_session) -> None:
    result = transformer_session.run("x = torch.tensor([1.0])\ny = torch.tensor(x)\nprint('done')")
    assert result.error is None
    assert "UserWarning" in result.stdout and "done" in result.stdout


def test_subclass_without_super_init_gets_torchs_own_message(transformer_session) -> None:
    code = "class Bad(nn.Module):\n    def __init__(self):\n        self.lin = nn.Linear(1, 1)\nBad()"
    result = transformer_session.run(code)
    assert result.error and "line 3" in result.error and "Module.__init__()" in result.error
