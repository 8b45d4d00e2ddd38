"""Friction suite, the session's behaviour: the MLP families' snippets, the REPL echo, introspection, refusal
messages, hook and model resets, namespace persistence. They run in one sandbox session per model, as an agent's
cells would. The transformer snippets with exact outputs run on every transformer family and level in
tests/test_friction_families.py.
"""

from __future__ import annotations

import pytest
from helpers import cached_instance, shared_pool
from mechsandbox.server.sandbox import ModelPayload

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
