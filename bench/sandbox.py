"""Sandbox figures: zygote start, worker spawn, reset from the warm pool, snippet round trips, memory.

    python bench/sandbox.py [--n 200]

Everything goes through the real pool (all isolation layers on). Private memory is read from
/proc/<pid>/smaps_rollup (Private_Clean + Private_Dirty, and PSS) of a worker right after reset and
after the family's reference solution.
"""

from __future__ import annotations

import argparse
import statistics
import time

from mechsandbox.evaluation.procfs import smaps_rollup
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
from mechsandbox.tasks import get_family


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def row(label: str, xs: list[float], unit: float = 1e3, suffix: str = "ms") -> None:
    print(
        f"{label:44} p50 {pct(xs, 0.5) * unit:8.3f} {suffix}   p95 {pct(xs, 0.95) * unit:8.3f} {suffix}   n={len(xs)}"
    )


def wait_warm(pool: SandboxPool) -> None:
    deadline = time.time() + 30
    while len(pool.warm) < pool.settings.pool_size and time.time() < deadline:
        time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    t0 = time.perf_counter()
    pool = SandboxPool(SandboxSettings(pool_size=4)).start()
    print(f"layers: {pool.status()['layers']}")
    print(
        f"{'zygote start (to first hardened worker)':44} {time.perf_counter() - t0:8.3f} s "
        f"(zygote alone {pool.zygote.start_seconds:.3f} s)"
    )
    wait_warm(pool)
    spawn = []
    for _ in range(min(args.n, 60)):
        t = time.perf_counter()
        w = pool._spawn()
        spawn.append(time.perf_counter() - t)
        pool.release(w)
    row("worker spawn (fork + harden + handshake)", spawn)

    for task_id, forward, level in (("dead-neurons", "model(X)", "easy"), ("copy-head", "model(tokens)", "easy")):
        inst = get_family(task_id).generate(0, level)
        payload = ModelPayload.from_instance(inst)
        resets = []
        for _ in range(min(args.n, 40)):
            wait_warm(pool)
            t = time.perf_counter()
            s = pool.open_session(payload)
            resets.append(time.perf_counter() - t)
            s.close()
        row(f"reset from warm pool ({task_id}, {len(payload.blob) // 1024} KiB)", resets)
        s = pool.open_session(payload)
        after_reset = smaps_rollup(s.pid)
        for label, code in (
            ("print(1)", "print(1)"),
            ("model forward", f"y = {forward}"),
            (
                "torch.fft.rfft + numpy",
                "W = next(model.parameters())\nz = torch.fft.rfft(W, dim=0).abs()\nq = np.fft.rfft(W.numpy(), axis=0)",
            ),
        ):
            s.run(code)
            times = []
            for _ in range(args.n):
                t = time.perf_counter()
                r = s.run(code)
                times.append(time.perf_counter() - t)
                assert r.error is None, r.error
            row(f"round trip {label} ({task_id})", times)
        s.close()
        fam = get_family(task_id)
        s = pool.open_session(payload)
        for code in fam.reference:
            assert s.run(code).error is None
        after_ref = smaps_rollup(s.pid)
        for label, m in (("after reset", after_reset), ("after reference solution", after_ref)):
            private = (m.get("Private_Clean", 0) + m.get("Private_Dirty", 0)) / 2**20
            print(
                f"{'worker memory ' + label + f' ({task_id})':44} private {private:7.1f} MiB   "
                f"Private_Dirty {m.get('Private_Dirty', 0) / 2**20:7.1f} MiB   PSS {m.get('Pss', 0) / 2**20:7.1f} MiB"
            )
        s.close()
    wait_warm(pool)
    idle = [smaps_rollup(w.pid) for w in list(pool.warm)]
    private = [(m.get("Private_Clean", 0) + m.get("Private_Dirty", 0)) / 2**20 for m in idle]
    print(
        f"{'idle warm worker private memory':44} mean {statistics.mean(private):7.1f} MiB   "
        f"max {max(private):7.1f} MiB   (n={len(idle)})"
    )
    pool.close()


if __name__ == "__main__":
    main()
