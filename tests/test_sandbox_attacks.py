"""Attack suite: hostile snippets, by category, against the real sandbox (all three layers).

Each attack asserts a safe outcome (a clear error, a timeout, truncation), that no secret planted by
the test shows up in what comes back, and (at the end of each category) that a fresh session still
works. Secrets: a 0600 canary file, an environment variable set in the server before the pool
starts, and the instance's ground truth.
"""

from __future__ import annotations

import json
import os
import re
import secrets

import pytest
from helpers import cached_instance
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings

CANARY = secrets.token_hex(16)
ENV_SECRET = secrets.token_hex(16)
REFUSED = r"refused|not available|NameError|ImportError|policy|read-only|cannot|TypeError"

FILE_READ = [
    ("open", "print(open('/etc/passwd').read())", r"NameError: name 'open'"),
    ("builtins-dict", "print(__builtins__['open'])", r"policy.*__builtins__"),
    ("torch-from-file", "print(torch.from_file('{canary}', False, 16))", r"torch\.from_file is refused"),
    ("storage-from-file", "torch.zeros(1).untyped_storage().from_file('{canary}', False, 16)", r"refused"),
    ("np-loadtxt", "print(np.loadtxt('{canary}', dtype=str))", r"numpy\.loadtxt is refused"),
    ("np-genfromtxt", "print(np.genfromtxt('/etc/passwd', dtype=str, delimiter='\\n'))", r"refused"),
    ("np-fromfile", "print(np.fromfile('{canary}', dtype='uint8'))", r"refused"),
    ("np-memmap", "print(np.memmap('{canary}'))", r"refused"),
    ("np-load", "print(np.load('{canary}'))", r"refused"),
    ("torch-load", "print(torch.load('{canary}'))", r"refused"),
    ("np-lib-npyio", "print(np.lib.npyio)", r"refused"),
    ("np-datasource", "print(np.DataSource().open('{canary}').read())", r"not available"),
    ("proc-environ", "print(torch.from_file('/proc/self/environ', False, 100))", r"refused"),
    ("repo-relative", "print(np.loadtxt('../../pyproject.toml', dtype=str))", r"refused"),
    ("import-io", "import io\nprint(io.open('{canary}').read())", r"ImportError"),
    ("import-pathlib", "import pathlib\nprint(pathlib.Path('{canary}').read_text())", r"ImportError"),
]

IMPORTS = [
    ("os", "import os\nprint(os.environ)", r"module 'os' is not available"),
    ("sys", "import sys\nprint(sys.modules)", r"ImportError"),
    ("subprocess", "import subprocess", r"ImportError"),
    ("from-torch-os", "from torch import os\nprint(os.system('id'))", r"ImportError: cannot import name 'os'"),
    ("import-torch-os", "import torch.os", r"ImportError"),
    ("dunder-import", "print(__import__('os'))", r"policy"),
    ("importlib", "import importlib", r"ImportError"),
    ("ctypes", "import ctypes", r"ImportError"),
    ("from-numpy-f2py", "from numpy import f2py\nprint(f2py.subprocess)", r"ImportError"),
    ("from-torch-serialization", "from torch import serialization\nprint(serialization.pickle)", r"ImportError"),
    ("import-torch-serialization", "import torch.serialization", r"ImportError"),
    ("relative", "from . import tasks", r"ImportError|policy"),
    ("star", "from torch import *", r"policy"),
    ("pickle", "import pickle", r"ImportError"),
    ("builtins-module", "import builtins\nprint(builtins.open)", r"ImportError|reserved name"),
]

ATTRIBUTE_WALKS = [
    ("torch-os", "print(torch.os.system('id'))", r"torch\.os is refused"),
    ("functional-torch", "print(torch.nn.functional.torch.os)", r"not available"),
    ("fft-torch", "print(torch.fft.torch)", r"not available"),
    ("np-f2py", "print(np.f2py.subprocess)", r"refused"),
    ("np-ctypeslib", "print(np.ctypeslib.ctypes)", r"refused"),
    ("torch-serialization", "print(torch.serialization.pickle)", r"refused"),
    ("torch-hub", "torch.hub.load('.', 'x', source='local')", r"refused"),
    ("torch-utils", "print(torch.utils.data.DataLoader)", r"refused"),
    ("torch-multiprocessing", "print(torch.multiprocessing)", r"refused"),
    ("nn-functional-np", "print(F.np)", r"not available"),
    ("getattr-concat", "print(getattr(torch, 'o' + 's'))", r"refused"),
    ("getattr-dunder", "print(getattr(model, '__cl' + 'ass__'))", r"not available"),
    ("tensor-mro", "print(torch.Tensor.mro())", r"refused"),
    ("model-forward-globals", "print(model.forward.__globals__)", r"policy"),
    ("typeview-mro", "print(type(1).mro())", r"refused|has no attribute"),
    ("typeview-call", "print(type(model)(None))", r"not callable"),
    ("hook-globals", "print(utils.get_act_name.__globals__)", r"policy"),
    ("facade-members", "print(getattr(torch, '_members'))", r"not available"),
    (
        "autograd-node-walk",
        "x = torch.ones(1, requires_grad=True)\nprint(getattr((x * 2).grad_fn, '_saved_self'))",
        r"not available",
    ),
]

DUNDER_AND_FRAMES = [
    ("subclasses", "print(().__class__.__bases__[0].__subclasses__())", r"policy"),
    ("traceback", "try:\n    1 / 0\nexcept Exception as e:\n    print(e.__traceback__)", r"policy"),
    ("with-traceback", "try:\n    1 / 0\nexcept Exception as e:\n    print(e.with_traceback)", r"refused"),
    ("gi-frame", "g = (i for i in [1])\nprint(g.gi_frame.f_back.f_globals)", r"policy"),
    ("gi-frame-getattr", "g = (i for i in [1])\nprint(getattr(g, 'gi_frame'))", r"not available"),
    ("gi-code-getattr", "g = (i for i in [1])\nprint(getattr(g, 'gi_code'))", r"not available"),
    ("attribute-error-obj", "try:\n    torch.nothing\nexcept AttributeError as e:\n    print(e.obj)", r"refused"),
    ("fstring-dunder", "print(f'{model.__class__}')", r"policy"),
    ("posonly-shadow", "def f(_getattr_=print, /):\n    return 1\nprint(f())", r"policy"),
    ("except-star", "try:\n    pass\nexcept* Exception:\n    pass", r"policy|SyntaxError"),
]

FORMAT_STRINGS = [
    ("format-attr", "print('{0.__class__}'.format(1))", r"format fields"),
    ("format-index", "print('{0[0]}'.format([1]))", r"format fields"),
    ("format-map", "print('{a.real}'.format_map({'a': 1}))", r"format fields"),
    ("format-nested", "print('{0:{1.__class__}}'.format(1, 2))", r"format fields"),
    ("unbound-str-format", "print(str.format('{0.__class__.__base__.__subclasses__}', 1))", r"str\.format is refused"),
    ("unbound-format-map", "print(getattr(str, 'format_map')('{a.__class__}', {'a': 1}))", r"refused"),
    ("string-formatter", "import string\nprint(string.Formatter().get_field('0.__class__', [1], {}))", r"ImportError"),
]

BUILTINS_RECOVERY = [
    ("print-self", "print(getattr(print, '__self__'))", r"not available"),
    ("help-globals", "print(help.__globals__)", r"policy"),
    # dir() and globals() list the namespace (issue 17): a filtered copy, never the exec globals themselves
    ("globals-builtins", "print(globals()['__builtins__'])", r"KeyError"),
    ("globals-guard-write", "g = globals()\ng['_getattr_'] = print\nprint(getattr(model, '__dict__'))", "not avail"),
    ("vars", "print(vars(model))", r"NameError"),
    ("eval", "print(eval('1'))", r"policy"),
    ("exec", "exec('x = 1')", r"policy"),
    ("compile", "print(compile('1', 's', 'eval'))", r"NameError"),
    ("type-three-args", "print(type('X', (), {}))", r"three arguments"),
    ("object", "print(object)", r"NameError"),
    ("setattr-facade", "setattr(torch, 'relu', print)", r"read-only"),
    ("exit", "exit()", r"NameError"),
]

PICKLE_AND_WRITE = [
    ("torch-save", "torch.save(model.state_dict(), 'x.pt')", r"refused"),
    ("np-save", "np.save('x.npy', np.zeros(2))", r"refused"),
    ("np-savetxt", "np.savetxt('/tmp/x.txt', np.zeros(2))", r"refused"),
    ("ndarray-dumps", "print(np.zeros(2).dumps())", r"refused"),
    ("ndarray-dump", "np.zeros(2).dump('/tmp/x')", r"refused"),
    ("tofile", "np.zeros(2).tofile('/tmp/x')", r"refused"),
    ("share-memory", "torch.zeros(2).share_memory_()", r"refused"),
    ("reduce-ex", "print(model.__reduce_ex__(2))", r"policy"),
]

NATIVE_AND_JIT = [
    ("ops-load-library", "torch.ops.load_library('/lib/x86_64-linux-gnu/libc.so.6')", r"refused"),
    ("torch-classes", "print(torch.classes)", r"refused"),
    ("ctypeslib-load", "np.ctypeslib.load_library('libc', '/lib')", r"refused"),
    ("cpp-extension", "torch.utils.cpp_extension.load_inline('x', '')", r"refused"),
    ("jit-cu", "torch.jit.CompilationUnit('def f(x):\\n    return x')", r"refused"),
    ("compilation-unit", "torch.CompilationUnit('def f(x):\\n    return x')", r"refused|not available"),
    ("torch-compile", "torch.compile(model)", r"refused"),
    ("torch-fx", "torch.fx.symbolic_trace(model)", r"refused"),
    ("torch-cond", "torch.cond(True, lambda: 1, lambda: 2, ())", r"refused"),
    ("import-ir", "torch.import_ir_module", r"refused"),
]

MEMORY = [
    ("torch-as-strided", "print(torch.as_strided(torch.zeros(1), (100000,), (1,)))", r"refused"),
    ("tensor-as-strided", "print(torch.zeros(1).as_strided((100000,), (1,)))", r"refused"),
    ("np-stride-tricks", "print(np.lib.stride_tricks.as_strided(np.zeros(1), (10**6,), (8,)))", r"refused"),
    ("ndarray-ctypes", "print(np.zeros(2).ctypes.data)", r"refused"),
    ("data-ptr", "print(torch.zeros(2).data_ptr())", r"refused"),
    ("set-strides", "a = np.zeros(2)\na.strides = (8000000,)", r"read-only"),
    ("ndarray-buffer", "print(np.ndarray((10**6,), buffer=np.zeros(1)).sum())", r"TypeError|too small"),
    ("empty-strided", "print(torch.empty_strided((10,), (100000,)))", r"refused"),
    ("frombuffer", "print(np.frombuffer(b'abcdefgh', dtype='uint8'))", r"not available"),
    ("tensor-set", "x = torch.zeros(1)\nx.set_(torch.zeros(10**6))", r"refused"),
    ("ndarray-base", "print(np.zeros(4)[1:].base)", r"refused"),
]

# Issue 54: a string given as data must never become an attribute (or read one), no object may answer an interface
# protocol to an array constructor, and no tensor may leave the strided layout. Each closed as a class: see
# docs/SANDBOX.md, "Escape classes closed in layers 1 and 2", and tests/test_sandbox_class_audit.py.
_UNDERSCORE = r"names starting with '_' are refused"
_NOT_ARRAY = r"is refused: an argument of type .* is not a tensor, an array"
_LAYOUT = r"layouts are not available in the sandbox"
_INTERFACE = "{'shape': (1,), 'typestr': '<u8', 'data': (8, False), 'version': 3}"

NAMES_AS_DATA = [
    (
        "parameterdict-interface",
        f"pd = nn.ParameterDict()\npd['__array_interface__'] = {_INTERFACE}\nnp.asarray(pd)",
        _UNDERSCORE,
    ),
    ("parameterdict-read-class", "print(nn.ParameterDict()['__class__'])", _UNDERSCORE),
    ("parameterdict-update", "nn.ParameterDict().update({'__array__': 1})", _UNDERSCORE),
    ("moduledict-dunder", "nn.ModuleDict({'__array__': nn.Identity()})", _UNDERSCORE),
    (
        "sequential-dict",
        "import collections\nnn.Sequential(collections.OrderedDict([('__dlpack__', nn.ReLU())]))",
        _UNDERSCORE,
    ),
    ("model-register-buffer", "model.register_buffer('__array_interface__', torch.ones(1))", _UNDERSCORE),
    ("register-parameter", "nn.Linear(2, 2).register_parameter('_p', nn.Parameter(torch.ones(1)))", _UNDERSCORE),
    ("unbound-add-module", "nn.Module.add_module(model, '__array__', nn.Identity())", _UNDERSCORE),
    ("get-submodule-dunder", "print(model.get_submodule('blocks.__class__'))", _UNDERSCORE),
    (
        "namedtuple-module",
        "import collections\ncollections.namedtuple('P', 'a', module='sandbox')",
        r"module=\.\.\.\) is refused",
    ),
]

PROTOCOLS = [
    ("np-asarray-module", "print(np.asarray(nn.Identity()))", _NOT_ARRAY),
    ("np-sum-module", "print(np.sum(nn.ParameterDict()))", _NOT_ARRAY),
    ("np-ufunc-module", "print(np.add(nn.ModuleDict(), 1))", _NOT_ARRAY),
    ("np-nested-module", "print(np.array([[1, nn.Identity()]], dtype='O'))", _NOT_ARRAY),
    ("to-numpy-module", "print(utils.to_numpy(nn.ParameterDict()))", r"to_numpy takes a tensor"),
    ("torch-tensor-module", "print(torch.tensor(nn.Identity()))", _NOT_ARRAY),
    ("new-tensor-module", "print(torch.zeros(1).new_tensor(model))", _NOT_ARRAY),
    ("object-array-item", "a = np.empty(1, dtype='O')\na[0] = nn.Identity()", r"item cannot be set"),
    ("object-array-bytes", "print(np.array([1, 'a'], dtype='O').tobytes())", r"items' addresses"),
    ("ndarray-memoryview", "print(np.zeros(2).data)", r"memoryview object is not available"),
    ("module-compile", "model.compile()\nmodel(tokens)", r"'compile' is refused"),
]

RAW_LAYOUTS = [
    ("sparse-index-write", "s = torch.ones(4).to_sparse()\ns.indices()[0, 0] = 10 ** 9\nprint(s.to_dense())", _LAYOUT),
    ("sparse-csr", "print(torch.eye(3).to_sparse_csr())", _LAYOUT),
    ("sparse-coo-unbound", "print(torch.Tensor.to_sparse_coo(torch.eye(2)))", _LAYOUT),
    ("sparse-mask", "print(torch.eye(2).sparse_mask(torch.eye(2)))", _LAYOUT),
    ("mkldnn", "print(torch.ones(2).to_mkldnn())", _LAYOUT),
    ("indices", "print(torch.ones(2).indices())", _LAYOUT),
    ("sparse-coo-tensor", "print(torch.sparse_coo_tensor([[0]], [1.0], (1,)))", r"not available"),
    ("quantize", "print(torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8))", r"refused|not available"),
    ("nested", "print(torch.nested.nested_tensor([torch.ones(2)]))", r"not available"),
]


def _all_cases() -> list[tuple[str, str, str]]:
    groups = {
        "file-read": FILE_READ,
        "imports": IMPORTS,
        "attribute-walks": ATTRIBUTE_WALKS,
        "dunder-frames": DUNDER_AND_FRAMES,
        "format-strings": FORMAT_STRINGS,
        "builtins": BUILTINS_RECOVERY,
        "pickle-write": PICKLE_AND_WRITE,
        "native-jit": NATIVE_AND_JIT,
        "memory": MEMORY,
        "names-as-data": NAMES_AS_DATA,
        "protocols": PROTOCOLS,
        "raw-layouts": RAW_LAYOUTS,
    }
    return [(f"{group}/{name}", code, pattern) for group, cases in groups.items() for name, code, pattern in cases]


CASES = _all_cases()


@pytest.fixture(scope="module")
def canary_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("secret") / "canary.txt"
    path.write_text(CANARY)
    os.chmod(path, 0o600)
    return str(path)


@pytest.fixture(scope="module")
def pool():
    os.environ["MECHSANDBOX_TEST_SECRET"] = ENV_SECRET
    try:
        with SandboxPool(SandboxSettings(pool_size=2, wall_seconds=4.0, worker_memory_mb=1024)) as p:
            yield p
    finally:
        os.environ.pop("MECHSANDBOX_TEST_SECRET", None)


@pytest.fixture(scope="module")
def instance():
    return cached_instance("copy-head", 0, "easy")


@pytest.fixture(scope="module")
def session(pool, instance):
    s = pool.open_session(ModelPayload.from_instance(instance))
    yield s
    s.close()


def assert_no_secret(text: str, instance) -> None:
    assert CANARY not in text and ENV_SECRET not in text
    assert "root:x:0:0" not in text
    assert json.dumps(instance.truth) not in text


def test_at_least_sixty_attacks() -> None:
    assert len(CASES) >= 60


@pytest.mark.parametrize(("case_id", "code", "pattern"), CASES, ids=[c[0] for c in CASES])
def test_attack_is_refused(session, instance, canary_path, case_id: str, code: str, pattern: str) -> None:
    result = session.run(code.replace("{canary}", canary_path))
    assert result.error is not None, f"{case_id} ran: {result.stdout[:200]}"
    assert re.search(pattern, result.error), result.error
    assert not result.namespace_reset
    assert_no_secret(result.stdout + result.error, instance)
    assert "/work/" not in result.error and "site-packages" not in result.error, result.error


def test_errors_never_echo_the_snippet_source(session) -> None:
    marker = "zzq_marker_" + secrets.token_hex(4)
    for code in (f"{marker} = (", f"_{marker} = 1", f"x = {marker}_undefined_name + 1"):
        result = session.run(code)
        assert result.error
        assert f"{marker} = (" not in result.error and "= 1" not in result.error


ADDRESS = re.compile(r"0x[0-9a-fA-F]{7,}")

SHOWS_AN_ADDRESS = [
    ("repr-function", "def f():\n    pass\nprint(repr(f))"),
    ("fstring-method", "print(f'{model.hooks!r} {torch.relu}')"),
    ("percent-builtin", "print('%s %r' % (torch.zeros(1).add, np.random.default_rng(0)))"),
    ("str-format", "print('{} {}'.format(lambda: 0, iter([1])))"),
    ("str-and-format", "print(str(print), format(model.hooks, ''), ascii(reset_model))"),
    ("echo-instance", "class A:\n    pass\nA()"),
    ("printed-back", "print(utils.to_numpy)\ntext = printed\nprint(text)"),
    (
        "exception-args",
        "try:\n    [].index(reset_model)\nexcept ValueError as e:\n    print(e.args[0], str(e), repr(e))",
    ),
    ("error-line", "raise ValueError(reset_model)"),
    ("library-error", "[].index(np.random.default_rng(0))"),
]


@pytest.mark.parametrize(("case_id", "code"), SHOWS_AN_ADDRESS, ids=[c[0] for c in SHOWS_AN_ADDRESS])
def test_no_text_shows_an_address(session, case_id: str, code: str) -> None:
    """Default reprs print addresses (``<function f at 0x7f...>``); with one and a raw-memory primitive a snippet
    owns the worker. Whatever route the text takes to the snippet or the agent, the address is hidden."""
    result = session.run(code)
    shown = result.stdout + (result.error or "")
    assert "0x..." in shown, shown  # the object was shown, without its address
    assert not ADDRESS.search(shown), shown


# --- resource exhaustion, exits and crashes ----------------------------------------------------


def test_cpu_loop_gets_a_readable_timeout(session) -> None:
    result = session.run("while True:\n    pass")
    assert result.error and "TimeoutError" in result.error
    assert session.run("print('alive')").stdout == "alive\n"


def test_loop_that_swallows_exceptions_is_killed_and_the_namespace_reset(session) -> None:
    session.run("kept = 1")
    result = session.run(
        "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"
    )
    assert result.namespace_reset and "wall-clock limit" in result.error
    after = session.run("print(kept)")
    assert after.namespace_reset is False and "NameError" in after.error
    assert session.run("print(model.cfg.n_layers)").stdout == "2\n"


def test_uninterruptible_c_call_is_killed(session) -> None:
    result = session.run("x = torch.ones(6000, 6000)\ny = x @ x @ x\nprint(1)")
    assert result.namespace_reset and "wall-clock" in result.error
    assert session.run("print(2)").stdout == "2\n"


@pytest.mark.parametrize(
    "code",
    [
        "x = torch.empty(10 ** 12)",
        "x = 'a' * 10 ** 11",
        "x = [0] * 10 ** 11",
        # Gradual growth of the address space. ``empty``, not ``ones``: filling 1 GiB page by page took longer
        # than the 4 s wall limit on a slow day of the 2-core CI machine, which made this a test of memset speed;
        # growth of *touched* memory is the watchdog's, tested in test_sandbox_process.py.
        "xs = []\nwhile True:\n    xs.append(torch.empty(10 ** 7))",
    ],
)
def test_memory_bombs_fail_cleanly(session, code: str) -> None:
    result = session.run(code)
    assert result.error and re.search(r"MemoryError|RuntimeError|OverflowError", result.error), result.error
    session.run("xs = None")
    assert session.run("print(3)").stdout == "3\n"


def test_output_and_answers_are_valid_unicode(session) -> None:
    result = session.run("print('a\\ud800b')\nanswer = ['\\ud800']")
    assert result.stdout == "a?b\n"
    value, error = session.solution_from("answer")
    assert value is None and "Unicode" in error
    assert "?" in session.run("raise ValueError('\\udcff')").error


def test_recursion_is_an_error(session) -> None:
    result = session.run("def f(n):\n    return f(n + 1)\nf(0)")
    assert "RecursionError" in result.error


def test_deeply_nested_source_is_a_clean_syntax_error(session) -> None:
    result = session.run("x = " + "(" * 30_000 + ")" * 30_000)
    assert result.error and "SyntaxError" in result.error and "((" not in result.error


def test_huge_output_is_truncated_at_the_cap(session) -> None:
    result = session.run("while True:\n    print('x' * 1000)")
    assert result.output_truncated and len(result.stdout.encode()) <= 64 * 1024
    assert "OutputLimit" in result.error
    single = session.run("print('y' * 10 ** 6)")
    assert single.output_truncated and len(single.stdout.encode()) <= 64 * 1024


@pytest.mark.parametrize(
    ("code", "pattern"),
    [
        ("raise SystemExit(3)", "SystemExit"),
        ("raise KeyboardInterrupt", "KeyboardInterrupt"),
        ("quit()", "NameError"),
        ("import signal", "ImportError"),
        ("import threading", "ImportError"),
        ("import time\ntime.sleep(100)", "ImportError"),
        ("torch.set_num_threads(4096)", "refused"),
        ("torch.set_default_dtype(torch.float64)", "refused"),
        ("torch.set_printoptions(profile='full')", "refused"),
        ("np.set_printoptions(threshold=10 ** 9)", "refused"),
    ],
)
def test_exits_and_global_setters_are_errors_not_crashes(session, code: str, pattern: str) -> None:
    result = session.run(code)
    assert result.error and pattern in result.error
    assert not result.namespace_reset
    assert session.run("print(4)").stdout == "4\n"


# --- shared state ------------------------------------------------------------------------------


def test_one_sessions_changes_never_reach_another(pool, instance) -> None:
    payload = ModelPayload.from_instance(instance)
    a, b = pool.open_session(payload), pool.open_session(payload)
    try:
        before = b.run("print(float(model.W_E.abs().sum()))").stdout
        poison = (
            "model.W_E[:] = 0\ntorch.manual_seed(123)\nimport random\nrandom.seed(5)\n"
            "model.forward = lambda *a, **k: 0\nprint(float(model.W_E.abs().sum()))"
        )
        assert a.run(poison).stdout == "0.0\n"
        for patch in (
            "torch.relu = print",
            "nn.Linear.forward = print",
            "torch.Tensor.add = print",
            "F.softmax = print",
            "np.sum = print",
            "math.pi = 3",
        ):
            assert "read-only" in a.run(patch).error
        assert b.run("print(float(model.W_E.abs().sum()))").stdout == before != "0.0\n"
        assert b.run("print(torch.relu(torch.tensor([-1.0])).item())").stdout == "0.0\n"
        assert b.run("print(model(tokens).shape)").error is None
        fresh = pool.open_session(payload)
        assert fresh.run("print(float(model.W_E.abs().sum()))").stdout == before
        fresh.close()
    finally:
        a.close()
        b.close()


# --- submission abuse --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "name", "pattern"),
    [
        ("class Eq:\n    def __eq__(self, o):\n        return True\nanswer = Eq()", "answer", "cannot contain a 'Eq'"),
        ("class I(int):\n    pass\nanswer = [I(3)]", "answer", "cannot contain a 'I'"),
        ("answer = [float('nan')]", "answer", "finite"),
        ("answer = [1e400 * 0]", "answer", "finite"),
        ("answer = list(range(10 ** 6))", "answer", "more than"),
        ("answer = []\nanswer.append(answer)", "answer", "deeper"),
        ("answer = [[[[[[[[[[1]]]]]]]]]]", "answer", "deeper"),
        ("answer = 'x' * 5000", "answer", "characters"),
        ("answer = {1: 2}", "answer", "keys"),
        ("answer = torch.zeros(10 ** 6)", "answer", "more than"),
        ("answer = [1]", "_getattr_", "name of a variable"),
        ("answer = [1]", "torch", "no variable"),
        ("answer = [1]", "missing_name", "no variable"),
        ("answer = [1]", "a b", "name of a variable"),
        ("answer = 2 ** 80", "answer", "smaller than"),
        ("answer = print", "answer", "cannot contain"),
        ("answer = torch.empty(3, device='meta')", "answer", "meta tensor"),
    ],
)
def test_solution_from_rejects_abuse(session, setup: str, name: str, pattern: str) -> None:
    assert session.run(setup).error is None
    value, error = session.solution_from(name)
    assert value is None and error and pattern in error, error


@pytest.mark.parametrize(
    "body",
    ["print('x' * 200000)", "raise KeyboardInterrupt()", "raise SystemExit(0)", "while True:\n            pass"],
)
def test_an_exception_whose_message_runs_hostile_code_is_one_line(session, body: str) -> None:
    """str(exc) can run snippet code (nn.Module.__repr__ calls the public extra_repr): whatever it does, the
    step ends with a one-line error and the namespace survives."""
    session.run("kept_before = 1")
    code = f"class M(nn.Module):\n    def extra_repr(self):\n        {body}\n        return 'm'\nraise ValueError(M())"
    result = session.run(code)
    assert result.error and "ValueError" in result.error and "\n" not in result.error.strip(), result.error
    assert not result.namespace_reset
    assert session.run("print(kept_before)").stdout == "1\n"


@pytest.mark.parametrize(
    "code",
    [
        "torch.linalg.eigvals(torch.full((24, 24), float('nan')))",
        "torch.linalg.eigvals(torch.full((24, 24), float('inf')).double())",
        "(torch.full((model.cfg.d_model, model.cfg.d_model), 3e38) @ model.OV[0, 0]).eigenvalues",
    ],
)
def test_eigvals_of_non_finite_matrices_is_an_error_not_a_crash(session, code: str) -> None:
    """MKL's xGEBAL segfaults or corrupts the heap on NaN/inf where torch.linalg.eig raises (torch 2.13, CPU)."""
    session.run("kept_before_eig = 1")
    result = session.run(code)
    assert result.error and "NaN or inf" in result.error and not result.namespace_reset, result.error
    assert session.run("print(kept_before_eig)").stdout == "1\n"


def test_a_failing_hooks_block_leaves_no_hooks(session) -> None:
    code = (
        "hits = []\ngood = ('hook_embed', lambda x, hook: hits.append(1))\ntry:\n"
        "    with model.hooks(fwd_hooks=[good, ('nope', print)]):\n        pass\nexcept KeyError:\n    pass\n"
        "model(tokens[:1])\nprint(hits)"
    )
    result = session.run(code)
    assert result.error is None and result.stdout == "[]\n", (result.stdout, result.error)


def test_solution_from_converts_exact_values(session) -> None:
    session.run("answer = [[0, 1], (1, 2)]\nbasis = torch.eye(2)\narr = np.arange(3)")
    assert session.solution_from("answer") == ([[0, 1], [1, 2]], None)
    assert session.solution_from("basis") == ([[1.0, 0.0], [0.0, 1.0]], None)
    assert session.solution_from("arr") == ([0, 1, 2], None)


def test_a_fresh_session_works_after_everything(pool, instance) -> None:
    s = pool.open_session(ModelPayload.from_instance(instance))
    try:
        assert s.run("print(model(tokens).shape)").stdout == "torch.Size([96, 12, 32])\n"
    finally:
        s.close()
    assert pool.healthy()
