"""The member audit of issue 14, grown by issue 54's classes: it walks every member a snippet can reach
(``test_sandbox_layers.reachable_callables``) and checks, through the real policy and facades (an in-process
``Runtime``; the process jail plays no part in layers 1-2):

- **no attribute by data**: every reachable class that a snippet can build without arguments is given dunder strings
  as item keys and as the first argument of every method that takes a name; none may become an attribute or a
  module-table entry, and none may read one back (``pd["__class__"]`` gave the real class);
- **no addresses**: ``repr``, ``str``, ``ascii``, ``format``, f-strings, ``%``, ``str.format``, ``print`` and ``hash``
  of every reachable member and of those instances show no address;
- **no raw layouts**: no reachable value is a non-strided layout or a quantized dtype (the only way to ask a factory
  for one), and no public tensor member, called with no argument or one, makes a sparse, mkldnn, nested or
  quantized tensor.

The generated search over compositions of these (bench/gadget_fuzz.py) runs in tests/test_gadget_fuzz.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from mechsandbox.server.sandbox.guest.facade import build_facades
from mechsandbox.server.sandbox.guest.runtime import Runtime
from test_sandbox_layers import reachable_callables

DUNDER_KEYS = ["__audit__", "__array_interface__", "_audit"]
ADDRESS = re.compile(r"0x[0-9a-fA-F]{7,}")


@pytest.fixture(scope="module")
def members() -> list[tuple[str, Any]]:
    return list(reachable_callables())


@pytest.fixture(scope="module")
def runtime() -> Runtime:
    rt = Runtime(build_facades(), output_cap=256 * 1024 * 1024)  # the audit prints every member
    rt.install({})
    return rt


def run_ok(rt: Runtime, code: str) -> None:
    result = rt.run(code)
    assert result["error"] is None, result["error"]


BUILD_AND_WRITE = """
made, reads = [], []
for i in range(len(classes)):
    try:
        o = classes[i]()
    except Exception:
        continue
    made.append(o)
    for key in keys:
        for value in (dict(), torch.ones(1), nn.Identity(), 3):
            try:
                o[key] = value
            except Exception:
                pass
        try:
            reads.append((o, o[key]))
        except Exception:
            pass
        for name in dir(o):
            if name in name_methods:
                for args in ((key,), (key, torch.ones(1)), (key, nn.Identity())):
                    try:
                        reads.append((o, getattr(o, name)(*args)))
                    except Exception:
                        pass
"""

#: Methods whose first parameter is a name or key (found by signature below, so a new one is tried too).
NAME_PARAMETERS = {"name", "key", "target", "attr", "attrname", "typename"}


def _first_parameter(obj: Any) -> str | None:
    import inspect

    try:
        params = [p for p in inspect.signature(obj).parameters if p != "self"]
    except (TypeError, ValueError):
        return None
    return params[0] if params else None


def test_no_container_or_registry_turns_a_dunder_string_into_an_attribute(members, runtime) -> None:
    classes = {id(obj): obj for _, obj in members if isinstance(obj, type)}
    name_methods = sorted(
        {path.rsplit(".", 1)[-1] for path, obj in members if _first_parameter(obj) in NAME_PARAMETERS}
    )
    assert {"add_module", "register_buffer", "setdefault", "update"} & set(name_methods), name_methods
    runtime.globals.update(classes=list(classes.values()), keys=DUNDER_KEYS, name_methods=name_methods)
    run_ok(runtime, BUILD_AND_WRITE)
    made, reads = runtime.globals["made"], runtime.globals["reads"]
    assert len(made) > 60, "the audit should build most nn layers, containers and stdlib classes"
    planted = []
    for o in made:
        tables = [getattr(o, "__dict__", None)]
        if isinstance(o, torch.nn.Module):
            tables += [o._parameters, o._buffers, o._modules]
        planted += [f"{type(o).__name__}[{k!r}]" for k in DUNDER_KEYS for t in tables if isinstance(t, dict) and k in t]
    planted += [f"{type(o).__name__} read its own {type(v).__name__}" for o, v in reads if v is type(o)]
    assert not planted, "strings that became attributes: " + ", ".join(sorted(set(planted)))


SHOW = """
texts, hashes = [], []
for i in range(len(objs)):
    try:
        x = objs[i]
    except Exception:
        continue
    for show in (repr, str, lambda v: ascii(v), lambda v: f'{v}', lambda v: f'{v!r:>3}', lambda v: '%s' % (v,),
                 '{}'.format, lambda v: format(v, '')):
        try:
            texts.append(show(x))
        except Exception as e:
            texts.append(str(e))
    try:
        hashes.append(hash(x))
        print(x)
    except Exception:
        pass
"""


def test_no_reachable_object_shows_an_address(members, runtime) -> None:
    objs = [obj for _, obj in members]
    objs += list(runtime.globals.get("made", []))  # the instances the container audit built, when it ran first
    runtime.globals.update(objs=objs)
    result = runtime.run(SHOW)
    assert result["error"] is None, result["error"]
    shown = [t for t in runtime.globals["texts"] if isinstance(t, str) and ADDRESS.search(t)]
    if ADDRESS.search(result["stdout"]):
        shown.append("printed: " + ADDRESS.search(result["stdout"]).string[:120])
    assert not shown, f"{len(shown)} texts show an address, e.g. {shown[:3]}"
    ids = {id(o) for o in objs}
    identity = {(i >> 4 | (i << 60)) & (2**64 - 1) for i in ids}
    assert not [h for h in runtime.globals["hashes"] if (h & (2**64 - 1)) in identity | ids]


LAYOUT_CALLS = """
made = []
t = torch.randn(4, 4)
for name in names:
    for args in ((), (1,)):
        try:
            made.append(getattr(t, name)(*args))
        except Exception:
            pass
"""


def test_no_reachable_value_is_a_raw_layout_or_quantized_dtype(members) -> None:
    quantized = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
    seen = []
    for facade in build_facades().values():
        for name in facade.member_names:
            value = getattr(facade, name)
            if (isinstance(value, torch.layout) and value is not torch.strided) or value in quantized:
                seen.append(name)
    for name in dir(torch.Tensor):
        value = getattr(torch.Tensor, name, None)
        if isinstance(value, torch.layout) and value is not torch.strided:
            seen.append(f"Tensor.{name}")
    assert not seen, seen


def test_no_tensor_member_makes_a_non_strided_tensor(runtime) -> None:
    """Every public name of ``torch.Tensor`` (not only what the sandbox's ``dir`` lists), read through the policy."""
    runtime.globals.update(names=[n for n in dir(torch.Tensor) if not n.startswith("_")])
    run_ok(runtime, LAYOUT_CALLS)
    raw = [
        f"{t.layout}{' quantized' if t.is_quantized else ''}"
        for t in runtime.globals["made"]
        if isinstance(t, torch.Tensor) and (t.layout != torch.strided or t.is_quantized or t.is_nested)
    ]
    assert len(runtime.globals["made"]) > 200  # most members ran
    assert not raw, f"tensor members made non-strided tensors: {sorted(set(raw))}"
