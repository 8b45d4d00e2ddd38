"""Gadget search over layers 1-2: compose facade members, containers and protocols under the sandbox's real policy and
report every produced object that exposes an address, a raw buffer, a non-strided layout or a dunder set by data.

    python bench/gadget_fuzz.py [--seconds 40] [--seed 0] [--without-guards]

Why: the escapes of issue 54 were compositions no reviewer listed (``nn.ParameterDict`` turned the key
``"__array_interface__"`` into an attribute that ``np.asarray`` honoured; ``repr`` of a snippet function printed its
address). A list of known gadgets finds only those; this search is told the *oracles*, not the gadgets, in the manner
of pyjailbreaker's gadget search:

- it starts from ordinary values (a tensor, an array, a snippet function and class, ``model``, a module, a dict, a
  generator, an exception) and every class and callable a facade offers;
- it calls members of what it holds with arguments drawn from what it holds plus a few marker strings (dunder names,
  the interface-protocol names), writes items with those strings as keys, and feeds every object to the array
  constructors, to ``depth`` steps;
- every step is a snippet run by ``Runtime`` (RestrictedPython policy, guards, facades; the process jail is not
  involved: that layer is tested as if these had fallen), and the host then inspects what the snippet holds:
  * **address**: a text the snippet made (``repr``, ``str``, f-string, ``%``, ``format``, an error message or its
    ``args``, printed output) contains a 0x-address, or an int or bytes value it holds contains the real address of
    an object it holds (``hash``, raw pointer bytes);
  * **dunder**: an object has an instance attribute or module-table entry named by one of the marker strings;
  * **raw buffer**: a memoryview, or an ndarray whose memory belongs to a non-array object;
  * **raw layout**: a tensor that is not strided (sparse, mkldnn, nested) or is quantized.

The search runs in a child process, so a crash is reported (as ``crash``, with the step it died in). Exit status 1 when
anything was found. ``--without-guards`` takes issue 54's guards out again (the name checks, the address-free
builtins, the layout and memoryview refusals) to show that the search, told only the oracles, finds those classes;
tests/test_gadget_fuzz.py runs both on every CI run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import json, random, re, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np
import torch
torch.set_num_threads(1)
from mechsandbox.arch import ARCHITECTURES, build, utils
from mechsandbox.server.sandbox.guest.facade import Facade, build_facades
from mechsandbox.server.sandbox.guest.runtime import Runtime

seconds, seed, progress_path, without_guards = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
MARKERS = ["__gadget__", "__array_interface__", "__array__", "__dlpack__", "__class__", "_gadget"]
ADDRESS_TEXT = re.compile(r"0x[0-9a-fA-F]{7,}")
facades = build_facades()
rt = Runtime(facades)
arch = ARCHITECTURES["HookedTransformer"]
model = build(arch.tiny_record()).eval().requires_grad_(False)
rt.install({"model": model, "tokens": arch.sample(arch.tiny_record()), "utils": utils})
SEEDS = """
import einops, itertools, functools, collections, statistics, heapq, random, re, copy
pool = [torch.randn(3, 4), np.arange(6.0), model, nn.Linear(2, 2), {}, [1, 2.0], 'k', 3, None]
def fn(x=1):
    return x
class C:
    def __init__(self):
        self.v = 1
pool += [fn, C(), C, (i for i in range(3)), ValueError('e'), nn.Parameter(torch.ones(2)), lambda: 0]
texts, ints, errors = [], [], []
"""
OBSERVE = """
kinds_seen = {}
def observe(v):
    kind = type(v)
    if kinds_seen.get(kind, 0) >= 3:  # a few of each type are shown: a repr's form is the type's
        return
    kinds_seen[kind] = kinds_seen.get(kind, 0) + 1
    for make in (repr, str, lambda x: ascii(x), lambda x: f'{x}', lambda x: f'{x!r}', lambda x: '%s' % (x,),
                 '{}'.format, lambda x: format(x, '')):
        try:
            texts.append(make(v))
        except Exception as e:
            errors.append(e)
    try:
        ints.append(hash(v))
    except Exception as e:
        errors.append(e)
    try:
        ints.append(id(v))
    except Exception as e:
        errors.append(e)
def note(e):
    errors.append(e)
    try:
        texts.append(str(e))
        texts.append(repr(getattr(e, 'args', ())))
    except Exception:
        pass
"""
if without_guards:  # the search's own check: issue 54's guards taken out again, as before the fix
    import re as _re
    from torch import nn
    from mechsandbox.server.sandbox.guest import facade, policy
    for owner, name in facade.NAME_GUARDED:
        setattr(owner, name, owner.__dict__[name].__wrapped__)
    rt.globals["__builtins__"].update(repr=repr, str=str, ascii=ascii, format=format, hash=hash)
    policy.LAYOUT_MEMBER = _re.compile("(?!)")
    policy._FORBIDDEN_TYPES = tuple(t for t in policy._FORBIDDEN_TYPES if t is not memoryview)
for code in (SEEDS, OBSERVE):
    r = rt.run(code)
    assert r["error"] is None, r["error"]


def facade_members():
    """(expression, object) for every callable a facade offers, by the name a snippet would write."""
    roots = ["torch", "np", "F", "einops", "itertools", "functools", "collections", "statistics", "heapq", "random",
             "re", "copy", "math", "json"]
    out, seen = [], set()

    def walk(expr, obj):
        if isinstance(obj, Facade):
            for n in obj.member_names:
                walk(f"{expr}.{n}", getattr(obj, n))
        elif callable(obj) and id(obj) not in seen:
            seen.add(id(obj))
            out.append((expr, obj))

    for name in roots:
        walk(name, rt.globals[name])
    return out + [("utils.to_numpy", utils.to_numpy), ("utils.get_act_name", utils.get_act_name)]


SKIP = re.compile(r"^(sleep|input|exit|quit|help|print)$|zeros_like|full|empty|ones|rand|arange|linspace|repeat|tile|"
                  r"resize|expand|kron|outer|cartesian|combinations|permutations|product|cycle|count|generate|hessian|"
                  r"jacobian|LBFGS|lru_cache|cache|eye|identity|tri|vander|meshgrid|mgrid|ogrid|indices|fromfunction|"
                  r"histogram|bincount|pad|fold|interpolate|unfold|block_diag|cdist|pdist|polar|lobpcg|matrix_power|"
                  r"pow|power|exp|ldexp|factorial|comb|perm|lgamma|gamma|isqrt|nlargest|nsmallest|backward|grad|"
                  r"train|register_.*hook|apply|share|manual_seed|seed")

rng = random.Random(seed)
deadline = time.perf_counter() + seconds
progress = open(progress_path, "a")
findings = {}
aborted = []


def finding(kind, what):
    examples = findings.setdefault(kind, [])
    if len(examples) < 3 and what[:300] not in examples:
        examples.append(what[:300])


def inspect_namespace():
    g = rt.globals
    held = list(g["pool"]) + list(g["errors"])
    ids = set()

    def collect(v, d=0):
        ids.add(id(v))
        if d < 2 and type(v) in (list, tuple):
            for x in v[:50]:
                collect(x, d + 1)
        if d < 2 and isinstance(v, np.ndarray) and v.dtype.hasobject:
            for x in v.ravel()[:50]:
                collect(x, d + 1)

    for v in held:
        collect(v)
    identity_hashes = {(i >> 4 | (i << 60)) & (2**64 - 1) for i in ids} | {i >> 4 for i in ids}
    for t in g["texts"]:
        if isinstance(t, str) and ADDRESS_TEXT.search(t):
            finding("address", f"text: {t[:200]}")
    for i in g["ints"]:
        if isinstance(i, int) and (i in ids or (i & (2**64 - 1)) in identity_hashes):
            finding("address", f"the int {i} is an address or an identity hash")
    for v in held:
        if isinstance(v, (bytes, bytearray)) and len(v) >= 8:
            if {int.from_bytes(v[k:k + 8], "little") for k in range(0, len(v) - 7, 8)} & ids:
                finding("address", f"bytes hold the address of a held object: {bytes(v[:16])!r}")
        if isinstance(v, memoryview):
            finding("raw-buffer", "a memoryview")
        if isinstance(v, np.ndarray):
            base = v
            while isinstance(base, np.ndarray) and base.base is not None:
                base = base.base
            if base is not None and not isinstance(base, (np.ndarray, bytes, torch.Tensor)):
                finding("raw-buffer", f"an ndarray over a {type(base).__name__}")
        if isinstance(v, torch.Tensor) and (v.layout != torch.strided or v.is_quantized or v.is_nested):
            finding("raw-layout", f"a tensor with layout {v.layout}, quantized={v.is_quantized}")
        own = getattr(v, "__dict__", None)
        tables = [own] if isinstance(own, dict) else []
        if isinstance(v, torch.nn.Module):
            tables += [v._parameters, v._buffers, v._modules]
        for m in MARKERS:
            if any(m in t for t in tables):
                finding("dunder", f"a {type(v).__name__} has an attribute {m!r} set by data")


def run(code):
    progress.write(code.splitlines()[1].strip() + "\n")
    progress.flush()
    result = rt.run(code)
    if result["error"] and len(aborted) < 5:  # a snippet stopped before its end: coverage lost, shown in the summary
        aborted.append(result["error"][:200])
    out = (result["stdout"] or "") + (result["error"] or "")
    if ADDRESS_TEXT.search(out):
        finding("address", f"output or error: {out[:200]}")


def kept(expr):
    """A statement that keeps what ``expr`` gives (observed) or the error it raises (observed)."""
    return f"try:\n    r = {expr}\n    pool.append(r)\n    observe(r)\nexcept Exception as e:\n    note(e)\n"


VALUES = ["{}", "torch.ones(1)", "nn.Identity()", "fn", "3"]
CONSUMERS = ["np.asarray", "np.sum", "torch.tensor", "torch.as_tensor", "utils.to_numpy"]


def explore(i, members_per_object):
    """Item writes keyed by marker strings, members read and called with markers and pool values, consumers."""
    obj = rt.globals["pool"][i]
    code = []
    for k, val in enumerate(VALUES):
        m = MARKERS[(i + k) % len(MARKERS)]
        code.append(f"try:\n    pool[{i}][{m!r}] = {val}\nexcept Exception as e:\n    note(e)\n")
    try:  # every public name, not only what the sandbox's dir() lists: the policy decides at the read
        names = [n for n in dir(obj) if not n.startswith("_") and not SKIP.search(n)]
    except Exception:
        names = []
    if members_per_object is not None and len(names) > members_per_object:
        names = rng.sample(names, members_per_object)
    n = len(rt.globals["pool"])
    for name in names:
        m = MARKERS[rng.randrange(len(MARKERS))]
        code.append(kept(f"getattr(pool[{i}], {name!r})"))
        for args in ("", f"{m!r}", f"{m!r}, {VALUES[rng.randrange(len(VALUES))]}", f"pool[{rng.randrange(n)}]"):
            code.append(kept(f"getattr(pool[{i}], {name!r})({args})"))
    for consumer in CONSUMERS:
        code.append(kept(f"{consumer}(pool[{i}])"))
    for start in range(0, len(code), 100):  # the sandbox takes snippets of up to 64 KiB
        run("".join(code[start : start + 100]))


def trim():
    inspect_namespace()
    g = rt.globals
    if len(g["pool"]) > 600:
        del g["pool"][300:]
    for name in ("texts", "ints", "errors"):
        del g[name][:]


# depth 1, systematic: every seed value and every facade class (called with no argument) is explored in full
n_seeds = len(rt.globals["pool"])
classes = [p for p, obj in facade_members() if isinstance(obj, type) or p.rsplit(".", 1)[-1][:1].isupper()]
for i in range(n_seeds):
    explore(i, None)
    trim()
explored = n_seeds
for path in classes:
    explored += 1
    before = len(rt.globals["pool"])
    run(kept(f"{path}()"))
    if len(rt.globals["pool"]) > before:
        explore(len(rt.globals["pool"]) - 1, None)
    trim()
# depth 2, random: facade callables on pool values, then what they give, until the budget is spent
systematic = seconds - (deadline - time.perf_counter())
callables = [p for p, _ in facade_members() if not SKIP.search(p.rsplit(".", 1)[-1])]
executed = 0
while time.perf_counter() < deadline:
    n = len(rt.globals["pool"])
    path = callables[rng.randrange(len(callables))]
    args = ", ".join(f"pool[{rng.randrange(n)}]" for _ in range(rng.randrange(3)))
    run(kept(f"{path}({args})"))
    if len(rt.globals["pool"]) > n:
        explore(len(rt.globals["pool"]) - 1, 4)
    executed += 1
    if executed % 20 == 0:
        trim()
inspect_namespace()
print(f"SYSTEMATIC {explored} objects in {systematic:.1f} s")
for line in aborted:
    print("ABORTED", line)
print("FINDINGS " + json.dumps(findings))
print("DONE", executed)
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40.0, help="the search's time budget")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--without-guards", action="store_true", help="take issue 54's guards out (self-check)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress"
        progress.touch()
        run = subprocess.run([sys.executable, "-c", CHILD, str(args.seconds), str(args.seed), str(progress),
                              "1" if args.without_guards else "0"],
                             capture_output=True, text=True, timeout=args.seconds + 600)  # fmt: skip
        last = (progress.read_text().splitlines() or ["(before the first step)"])[-1]
    findings: dict[str, list[str]] = {}
    for line in run.stdout.splitlines():
        if line.startswith("FINDINGS "):
            findings.update(json.loads(line.removeprefix("FINDINGS ")))
        elif line.startswith("SYSTEMATIC "):
            print("systematic pass:", line.removeprefix("SYSTEMATIC "))
        elif line.startswith("ABORTED "):
            print("a generated snippet stopped early:", line.removeprefix("ABORTED "))
    if "DONE" not in run.stdout:
        findings["crash"] = [f"the search died (exit {run.returncode}) at: {last}; {run.stderr[-300:]}"]
    steps = run.stdout.split()[-1] if "DONE" in run.stdout else "?"
    print(f"{steps} random steps after it; {len(findings)} classes found")
    for kind, examples in sorted(findings.items()):
        for what in examples:
            print(f"  {kind}: {' '.join(what.split())}")
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
