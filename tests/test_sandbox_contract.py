"""The sandbox's contract with the rest of the package: the payload and ``mechsandbox.arch`` only.

Why: the hardened worker should load the public model classes and nothing else of the package -- no
generator (it computes the truth), no artifact code. These tests check the import graph in a fresh
interpreter (the pytest process has long since imported everything), that every registered
architecture survives describe -> JSON -> build -> load_state_dict, and that the zygote's warm-up
covers the whole registry. The families' real models take the same path in
test_reference_solutions.py (every reference snippet runs in a sandbox session), so they are not
regenerated here (fact-storage alone took 26 s to generate on a loaded 2-core dev machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import cached_instance, shared_pool
from mechsandbox.arch import ARCHITECTURES, HELPERS, build, describe, helper_namespace, helpers_for
from mechsandbox.server.sandbox import ModelPayload, RunResult, SandboxUnavailable
from mechsandbox.server.sandbox.guest.warmup import warm_up_payloads

SANDBOX_DIR = Path(__file__).resolve().parents[1] / "server" / "sandbox"

# Runs in a fresh interpreter: import every module of the sandbox package (as the zygote and the
# worker would), optionally run the zygote's warm-up, and report what of the package got loaded.
PROBE = """
import importlib, json, pkgutil, sys
import mechsandbox.server.sandbox as sandbox
walked = [m.name for m in pkgutil.walk_packages(sandbox.__path__, sandbox.__name__ + ".")]
for name in walked:
    importlib.import_module(name)
warmed = []
if sys.argv[1] == "warm":
    from mechsandbox.server.sandbox.guest.facade import build_facades
    from mechsandbox.server.sandbox.guest.warmup import WARM_UP, warm_up, warm_up_payloads
    payloads = warm_up_payloads()
    warm_up(build_facades(), payloads, WARM_UP)
    warmed = [p.header["arch"]["class"] for p in payloads]
loaded = sorted(m for m in sys.modules if m.startswith("mechsandbox"))
print(json.dumps({"walked": walked, "loaded": loaded, "warmed": warmed}))
"""


def forbidden(module: str) -> bool:
    """The task framework (every family lives under it) and the artifact code."""
    return module in ("mechsandbox.tasks", "mechsandbox.export") or module.startswith("mechsandbox.tasks.")


def probe_fresh_interpreter(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def module_name(path: Path) -> str:
    parts = path.relative_to(SANDBOX_DIR).with_suffix("").parts
    return ".".join(("mechsandbox.server.sandbox", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def test_sandbox_modules_import_nothing_of_the_tasks_or_the_export() -> None:
    report = probe_fresh_interpreter("import")
    on_disk = {module_name(p) for p in SANDBOX_DIR.rglob("*.py") if p.parent != SANDBOX_DIR or p.stem != "__init__"}
    assert set(report["walked"]) == on_disk  # the walk saw every module, so the check below covers them all
    assert "mechsandbox.arch" in report["loaded"]
    assert [m for m in report["loaded"] if forbidden(m)] == []


def test_zygote_warm_up_covers_every_registered_architecture() -> None:
    assert [p.header["arch"]["class"] for p in warm_up_payloads()] == list(ARCHITECTURES)
    report = probe_fresh_interpreter("warm")  # the real warm-up: load + snippet against each tiny model
    assert report["warmed"] == list(ARCHITECTURES)
    assert [m for m in report["loaded"] if forbidden(m)] == []


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture_round_trips(name: str) -> None:
    arch = ARCHITECTURES[name]
    record = arch.tiny_record()
    model = build(record)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape))
    wire = json.loads(json.dumps(describe(model)))
    assert wire["class"] == name
    rebuilt = build(wire)
    assert type(rebuilt) is type(model) and describe(rebuilt) == wire
    rebuilt.load_state_dict(model.state_dict())  # strict: same keys and shapes
    x = arch.sample(record)
    assert torch.equal(rebuilt.eval()(x), model.eval()(x))
    assert set(helpers_for(model)) <= set(HELPERS)


def test_helpers_come_from_the_registry_only() -> None:
    assert helper_namespace(["utils"]) == {"utils": HELPERS["utils"]}
    for bad in (["os"], ["__builtins__"], [None], ["utils", "sys"]):
        with pytest.raises(ValueError, match="unknown sandbox helpers"):
            helper_namespace(bad)


def run_once(payload: ModelPayload, code: str) -> RunResult:
    session = shared_pool().open_session(payload)
    try:
        return session.run(code)
    finally:
        session.close()


def test_payload_names_the_helpers_and_the_worker_installs_only_those() -> None:
    hooked = ModelPayload.from_instance(cached_instance("copy-head", 0, "easy"))
    plain = ModelPayload.from_instance(cached_instance("dead-neurons", 0, "easy"))
    assert hooked.header["helpers"] == ["utils"] and plain.header["helpers"] == []
    with_utils = run_once(hooked, "print(utils.get_act_name('pattern', 0))")
    assert with_utils.error is None and with_utils.stdout == "blocks.0.attn.hook_pattern\n"
    without = run_once(plain, "print(utils)")
    assert without.error and "NameError" in without.error
    forged = ModelPayload({**plain.header, "helpers": ["os"]}, plain.blob)
    with pytest.raises(SandboxUnavailable, match="unknown sandbox helpers"):
        shared_pool().open_session(forged)


GUEST_PROBE = """
import importlib, json, pkgutil, sys
import mechsandbox.server.sandbox.guest as guest
for m in pkgutil.walk_packages(guest.__path__, guest.__name__ + "."):
    importlib.import_module(m.name)
from mechsandbox.server.sandbox.guest.facade import build_facades
from mechsandbox.server.sandbox.guest.warmup import WARM_UP, warm_up, warm_up_payloads
warm_up(build_facades(), warm_up_payloads(), WARM_UP)
print(json.dumps([(name, getattr(m, "__file__", None)) for name, m in sys.modules.items()
                  if name.startswith("mechsandbox")]))
"""


def test_the_guest_side_imports_no_host_code_and_only_what_the_jail_shows() -> None:
    """The trust boundary in the tree (issue 53): everything the zygote and its workers run lives under
    ``server/sandbox/guest`` or in the shared modules, never under ``host/``; and every file of the package they load is
    one the jail shows them (``code_paths.GUEST_CODE``), so the jail's copy of the code is complete."""
    from mechsandbox.server.sandbox.code_paths import GUEST_CODE

    out = subprocess.run([sys.executable, "-I", "-c", GUEST_PROBE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert [name for name, _ in loaded if ".sandbox.host" in name] == []
    package = Path(__file__).resolve().parents[1]
    shown = [package / entry for entry in GUEST_CODE]
    outside = [
        name
        for name, file in loaded
        if file and not any(Path(file) == p or p in Path(file).parents for p in shown)
    ]
    assert outside == [], f"the guest loads package files the jail does not show: {outside}"
