"""Crash scan of the sandbox's module facades: call every facade callable with non-finite and empty tensors and
report the ones that kill the process (a signal, not an exception).

    python bench/facade_fuzz.py [--modules torch,torch.linalg,...] [--plant-crash]

Why: a library's C code can crash on inputs it does not check (torch 2.13's ``torch.linalg.eigvals`` handed
NaN/inf to MKL, which segfaulted or corrupted the heap; now wrapped, see docs/SANDBOX.md). The process jail
survives such a crash, but the session loses its namespace, so a crash is a bug to wrap. Calls run in a child
process; when it dies, the scan records the callable and resumes after it in a fresh child. Shallow by design:
one or two tensor arguments per call (NaN, inf, float64 NaN, empty, batched -inf). The whole scan takes about
2 s, so tests/test_facade_fuzz.py runs it in full; ``--plant-crash`` adds a member that aborts the process, to show
the scan reports a crash and resumes after it. Exit status 1 when something crashed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import sys, warnings
import torch
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
from mechsandbox.server.sandbox.guest.facade import build_facades
facades = build_facades()
calls = [(m, n, getattr(facades[m], n)) for m in sys.argv[3].split(",") for n in facades[m].member_names]
calls = [(m, n, f) for m, n, f in calls if callable(f) and not isinstance(f, type)]
if sys.argv[4] == "plant":  # the scanner's own check: a member that kills the process, in the middle of the list
    import os
    calls.insert(len(calls) // 2, ("planted", "abort", lambda *args: os.abort()))
inputs = [torch.full((6, 6), float("nan")), torch.full((6, 6), float("inf")), torch.full((6, 6), float("nan")).double(),
          torch.empty(0, 0), torch.full((2, 6, 6), float("-inf"))]
with open(sys.argv[2], "a") as progress:
    for i in range(int(sys.argv[1]), len(calls)):
        module, name, fn = calls[i]
        progress.write(f"{i} {module}.{name}\n")
        progress.flush()
        for x in inputs:
            for args in ((x,), (x, x)):
                try:
                    fn(*args)
                except BaseException:
                    pass
print("DONE", len(calls))
"""

MODULES = "torch,torch.linalg,torch.special,torch.fft,torch.nn.functional,numpy,numpy.linalg,numpy.fft"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modules", default=MODULES)
    ap.add_argument("--plant-crash", action="store_true", help="add a member that aborts the process (self-check)")
    args = ap.parse_args()
    crashes = []
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress"
        progress.touch()
        start = 0
        while True:
            run = subprocess.run([sys.executable, "-c", CHILD, str(start), str(progress), args.modules,
                                  "plant" if args.plant_crash else "-"],
                                 capture_output=True, text=True, timeout=1800)  # fmt: skip
            if "DONE" in run.stdout:
                total = run.stdout.split()[-1]
                break
            last = progress.read_text().splitlines()[-1]
            crashes.append(f"{last.split()[1]} (exit {run.returncode})")
            start = int(last.split()[0]) + 1
    print(f"{total} callables scanned; {len(crashes)} crashed the process")
    for line in crashes:
        print("  crash:", line)
    sys.exit(1 if crashes else 0)


if __name__ == "__main__":
    main()
