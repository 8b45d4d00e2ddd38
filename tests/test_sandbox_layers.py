"""Layers 1-2 by class: no exposed callable takes an attribute name, a raw buffer, an offset or strides.

Why: the audit's escapes came through library callables doing, in library code, what the guards refuse
in snippet code: ``functools.wraps(f, updated=("__globals__",))`` copied a library function's globals
into the snippet's namespace by name, and ``np.ndarray(shape, dtype, buffer, offset=-8)`` read the heap
below an array. Fixing the two examples leaves the class open, so ``test_no_member_takes_memory_or_
attribute_name_parameters`` walks every member a snippet can reach (every facade, recursively; the
public attributes of every exposed class; the snippet's builtins) and fails on any parameter with such a
name unless it is reviewed below, with a reason. The attacks at the end run through the real sandbox.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import cached_instance
from mechsandbox.arch import (
    HELPERS,
    ActivationCache,
    EmbedMLP,
    FactoredMatrix,
    GatedMLP,
    HookedTransformer,
    ModAddMLP,
    SubspaceMLP,
    Tokenizer,
    ToySuperposition,
    helper_namespace,
)
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
from mechsandbox.server.sandbox.guest.facade import Facade, build_facades, make_import
from mechsandbox.server.sandbox.guest.policy import DENIED_ATTRIBUTES, OutputBuffer, make_builtins
from mechsandbox.server.sandbox.guest.runtime import Runtime

#: Parameter names that mean "an attribute name", "raw memory" or "a memo keyed by addresses".
SUSPECT = frozenset(
    [
        "assigned",
        "updated",
        "attr",
        "attrs",
        "attrname",
        "name",
        "names",
        "target",
        "buffer",
        "offset",
        "offsets",
        "strides",
        "stride",
        "storage_offset",
        "storage",
        "memo",
        "cls",
    ]
)

_DIAGONAL = "a diagonal index, bounds-checked by the library; no memory offset"
_KERNEL = "the step of a convolution or pooling window, not a memory stride"
_LOSS = "the target values of a loss function"
_MODULE_TABLE = (
    "reads or writes the module's own _modules/_parameters/_buffers tables; guarded by facade.install_name_guards: "
    "names with a part starting with '_' are refused from snippets (issue 54); only Module/Parameter/Tensor values "
    "come back"
)
_GUARDED = "the policy's own guarded version (underscore names refused, results checked)"

#: (member name, parameter) -> why it is safe. Reviewed by hand; a new entry needs the same care.
REVIEWED: dict[tuple[str, str], str] = {
    **{
        (m, "offset"): _DIAGONAL
        for m in ["diagonal", "diag_embed", "diagflat", "diagonal_scatter", "trace", "tril_indices", "triu_indices"]
    },
    **{
        (m, "stride"): _KERNEL
        for m in [
            "avg_pool1d",
            "avg_pool2d",
            "conv1d",
            "conv2d",
            "conv3d",
            "conv_transpose1d",
            "conv_transpose2d",
            "conv_transpose3d",
            "Conv1d",
            "Conv2d",
            "fold",
            "unfold",
        ]
    },
    **{
        (m, "target"): _LOSS
        for m in [
            "forward",
            "binary_cross_entropy",
            "binary_cross_entropy_with_logits",
            "cross_entropy",
            "huber_loss",
            "kl_div",
            "l1_loss",
            "mse_loss",
            "nll_loss",
            "smooth_l1_loss",
        ]
    },
    **{(m, "target"): _MODULE_TABLE for m in ["get_buffer", "get_parameter", "get_submodule"]},
    **{(m, "name"): _MODULE_TABLE for m in ["add_module", "register_buffer", "register_module", "register_parameter"]},
    **{(m, "name"): _GUARDED for m in ["getattr", "hasattr", "setattr", "delattr"]},
    ("add_hook", "name"): "a key of the model's hook_dict (KeyError otherwise), never an attribute name",
    ("get_act_name", "name"): "builds a hook-point name string; reads nothing",
    ("forward", "offsets"): "EmbeddingBag's bag starts, bounds-checked against the input (offsets[0] == 0)",
    ("named_modules", "memo"): "a set of modules to skip while walking the module's own children",
    ("as_subclass", "cls"): "changes the Python class of a tensor view to a Tensor subclass; no memory involved",
    ("total_ordering", "cls"): "the guarded version: only a class the snippet defines",
    ("issubclass", "cls"): "a class test; hands out nothing",
    ("classmethod", "cls"): "a decorator; the argument is the function it wraps",
    ("super", "cls"): "attribute lookups on the proxy go through the guarded getattr",
    ("__build_class__", "name"): "the class statement; the name becomes the new class's __name__",
    ("__import__", "name"): "the sandbox import hook: facades only",
    ("_getattr_", "name"): "RestrictedPython's own guarded getattr, unreachable by name (underscore)",
}


def parameter_names(obj: Any) -> set[str]:
    """Parameter names from ``inspect.signature``, else from the ``f(a, b=1)`` lines of a C docstring."""
    try:
        return set(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        pass
    names: set[str] = set()
    for call in re.finditer(r"\w+\(([^()]*)\)", (getattr(obj, "__doc__", None) or "")[:800]):
        for part in call.group(1).split(","):
            match = re.match(r"\s*\*{0,2}(\w+)", part)
            if match:
                names.add(match.group(1))
    return names


def _class_of(obj: Any) -> Any:
    """The class a facade's ``GuardedClass`` stands for; anything else unchanged."""
    try:
        return object.__getattribute__(obj, "_cls")
    except AttributeError:
        return obj


def reachable_callables() -> Iterator[tuple[str, Any]]:
    """Every callable a snippet can name: facade members (recursively), exposed classes' public attributes
    (what the attribute guard lets through) and the snippet's builtins."""
    facades = build_facades()
    seen: set[int] = set()

    def walk(path: str, obj: Any, top: bool) -> Iterator[tuple[str, Any]]:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Facade):
            for name in obj.member_names:
                yield from walk(f"{path}.{name}", getattr(obj, name), True)
            return
        if callable(obj):
            yield path, obj
        cls = _class_of(obj)
        if top and isinstance(cls, type):
            for name in dir(cls):
                if name.startswith("_") or name in DENIED_ATTRIBUTES:
                    continue
                try:
                    value = getattr(cls, name)
                except Exception:  # a descriptor that needs an instance
                    continue
                yield from walk(f"{path}.{name}", value, False)

    for name, facade in facades.items():
        yield from walk(name, facade, True)
    for name, value in make_builtins(lambda: OutputBuffer(64), make_import(facades)).items():
        yield from walk(f"builtins.{name}", value, True)
    for name, value in helper_namespace(list(HELPERS)).items():  # what a payload may add: ``utils``
        yield from walk(name, type(value), True)
    for name, value in Runtime(facades).session_functions().items():  # ``reset_model``
        yield from walk(name, value, True)
    for cls in (HookedTransformer, SubspaceMLP, ToySuperposition, ModAddMLP, GatedMLP, EmbedMLP):  # ``model``
        yield from walk(f"model.{cls.__name__}", cls, True)
    for cls in (ActivationCache, FactoredMatrix, Tokenizer):  # run_with_cache, model.OV / QK, model.tokenizer
        yield from walk(f"model.{cls.__name__}", cls, True)


def test_no_member_takes_memory_or_attribute_name_parameters() -> None:
    members = list(reachable_callables())
    assert len(members) > 1000, "the walk should reach torch, numpy, the stdlib facades and the builtins"
    unreviewed = []
    for path, obj in members:
        member = path.rsplit(".", 1)[-1]
        for param in sorted(parameter_names(obj) & SUSPECT):
            if (member, param) not in REVIEWED:
                unreviewed.append(f"{path}({param}=...)")
    assert not unreviewed, "callables that take attribute names or raw memory: " + ", ".join(unreviewed)


def test_every_review_still_matches_a_member() -> None:
    """A stale review (the member left the facades) would hide a future one with the same name."""
    used = {
        (path.rsplit(".", 1)[-1], param)
        for path, obj in reachable_callables()
        for param in parameter_names(obj) & SUSPECT
    }
    assert set(REVIEWED) - used == set()


def test_the_walk_catches_the_audited_members() -> None:
    """The parameter check itself sees the two audited sources (so an empty result means something)."""
    import functools

    import numpy as np

    assert {"assigned", "updated"} <= parameter_names(functools.wraps)
    assert {"buffer", "offset", "strides"} <= parameter_names(np.ndarray)
    assert {"stride", "storage_offset"} <= parameter_names(__import__("torch").as_strided)


# --- the two classes, through the real sandbox ------------------------------------------------

CLASS_ATTACKS = [
    (
        "wraps-updated-globals",
        "import functools\nimport statistics\ndef f():\n    pass\n"
        "functools.wraps(statistics.mean, updated=('__globals__',))(f)",
        r"unexpected keyword argument 'updated'",
    ),
    (
        "wraps-assigned",
        "import functools\nimport torch\ndef f():\n    pass\n"
        "functools.wraps(torch.nn.functional.relu, assigned=('__globals__',))(f)",
        r"unexpected keyword argument 'assigned'",
    ),
    ("update-wrapper", "import functools\nprint(functools.update_wrapper)", r"update_wrapper is refused"),
    (
        "wraps-library-target",
        "import functools\nimport math\nfunctools.wraps(math.floor)(math.ceil)",
        r"wraps is refused",
    ),
    (
        "total-ordering-library-class",
        "import functools\nimport torch\nfunctools.total_ordering(torch.nn.Linear)",
        r"total_ordering is refused",
    ),
    ("deepcopy-memo", "import copy\ncopy.deepcopy([1], {})", r"positional argument"),
    ("json-cls", "import json\njson.loads('1', cls=dict)", r"cls=\.\.\.\) is refused"),
    (
        "ndarray-negative-offset",
        "a = np.zeros(2)\nprint(np.ndarray((4,), np.float64, a, -8))",
        r"ndarray\(\.\.\.\) is refused",
    ),
    ("ndarray-foreign-buffer", "print(np.ndarray(shape=(4,), buffer=b'abcdefgh' * 4, dtype=np.uint8))", r"refused"),
    ("ndarray-strides", "print(np.ndarray((4,), np.float64, strides=(-8,)))", r"refused"),
    ("ndarray-subclass", "class A(np.ndarray):\n    pass\nA((4,), np.float64, b'x' * 64, -8)", r"subclassing"),
    ("np-frombuffer", "print(np.frombuffer(b'abcdefgh', offset=-8))", r"frombuffer is refused"),
    ("getfield", "print(np.zeros(2).getfield(np.int64, 8))", r"'getfield' is refused"),
    (
        "tensor-as-strided-scatter",
        "print(torch.zeros(4).as_strided_scatter(torch.zeros(1), (1,), (1,), -3))",
        r"refused",
    ),
    (
        "torch-segment-reduce",
        "print(torch.segment_reduce(torch.zeros(4), 'sum', offsets=torch.tensor([0, 100])))",
        r"segment_reduce",
    ),
    (
        "set-submodule",
        "m = torch.nn.Linear(2, 2)\nm.set_submodule('weight', torch.nn.ReLU())",
        r"'set_submodule' is refused",
    ),
]

STILL_WORKS = """
import functools, copy, json
def deco(g):
    @functools.wraps(g)
    def inner(*a):
        return g(*a) + 1
    return inner
@deco
def two():
    "doc"
    return 2
@functools.total_ordering
class V:
    def __init__(self, v):
        self.v = v
    def __lt__(self, o):
        return self.v < o.v
    def __eq__(self, o):
        return self.v == o.v
a = np.ndarray((2, 3), np.float32)
print(two(), 'ok', V(1) <= V(2), isinstance(np.zeros(1), np.ndarray), type(np.zeros(1)) == np.ndarray,
      np.ndarray == type(a), a.shape, copy.deepcopy([1, [2]]), json.loads(json.dumps({'a': 1}), object_hook=dict))
"""


@pytest.fixture(scope="module")
def session() -> Iterator[Any]:
    with SandboxPool(SandboxSettings(pool_size=1, wall_seconds=20.0)) as pool:
        sandbox = pool.open_session(ModelPayload.from_instance(cached_instance("copy-head", 0, "easy")))
        yield sandbox
        sandbox.close()


@pytest.mark.parametrize("case_id,code,pattern", CLASS_ATTACKS, ids=[c[0] for c in CLASS_ATTACKS])
def test_layer_attack_is_refused_with_one_line(session: Any, case_id: str, code: str, pattern: str) -> None:
    result = session.run(code)
    assert result.error, f"{case_id} was not refused: {result.stdout!r}"
    assert "\n" not in result.error.strip(), result.error
    assert re.search(pattern, result.error), result.error
    assert not result.namespace_reset


def test_escape_leaves_no_real_builtins_behind(session: Any) -> None:
    """The audit's chain: after the attempt, the next snippet still has no real open/exec/os."""
    session.run(CLASS_ATTACKS[0][1])
    session.run(CLASS_ATTACKS[1][1])
    for probe in ("print(open)", "print(exec)", "print(os)"):
        result = session.run(probe)
        assert result.error and "NameError" in result.error, (probe, result)


def test_ordinary_uses_still_work(session: Any) -> None:
    result = session.run(STILL_WORKS)
    assert result.error is None, result.error
    assert result.stdout.split()[:3] == ["3", "ok", "True"], result.stdout
