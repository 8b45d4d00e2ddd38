"""The model's way into a warm worker: a sealed memory file's descriptor against its bytes through the socket.

    OMP_NUM_THREADS=1 python bench/model_transfer.py [--n 20] [--pairs head-roles/hard,committee-circuit/hard,...]

For each (family, level), seed 0: ``--n`` loads of the same instance from the warm pool (``pool.open_session``:
take a hardened worker, send the model, the worker builds it), once with the payload sealed (the server's way since
issue 20: the descriptor goes with the load request, the worker maps the file copy-on-write) and once with plain
bytes (the way before). Prints p50 / p95 milliseconds and the model's size.
"""

from __future__ import annotations

import argparse
import statistics
import time

from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
from mechsandbox.tasks import get_family

PAIRS = (
    "dead-neurons/easy,copy-head/hard,induction-circuit/hard,committee-circuit/hard,fact-storage/hard,head-roles/hard"
)


def loads(pool: SandboxPool, payload: ModelPayload, n: int) -> list[float]:
    spent = []
    for _ in range(n):
        deadline = time.time() + 30
        while len(pool.warm) < pool.settings.pool_size and time.time() < deadline:  # a warm worker for each load
            time.sleep(0.01)
        started = time.perf_counter()
        session = pool.open_session(payload)
        spent.append((time.perf_counter() - started) * 1000)
        session.close()
    return sorted(spent)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--pairs", default=PAIRS)
    args = ap.parse_args()
    print(f"{'pair':26} {'MB':>6} {'sealed p50':>11} {'p95':>7} {'bytes p50':>10} {'p95':>7}")
    with SandboxPool(SandboxSettings(pool_size=4)) as pool:
        for pair in args.pairs.split(","):
            task_id, level = pair.split("/")
            inst = get_family(task_id).generate(0, level)
            sealed, plain = ModelPayload.from_instance(inst), ModelPayload.from_instance(inst, sealed=False)
            a, b = loads(pool, sealed, args.n), loads(pool, plain, args.n)
            p95 = round(0.95 * (args.n - 1))
            print(f"{pair:26} {len(plain.blob) / 1e6:6.1f} {statistics.median(a):11.1f} {a[p95]:7.1f} "
                  f"{statistics.median(b):10.1f} {b[p95]:7.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
