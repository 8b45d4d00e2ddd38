"""Where a WebSocket ``print(1)`` step spends its time in the server: py-spy samples the server
process while one client sends steps back to back, then prints the functions with the largest
inclusive share of the server's samples (idle waiting excluded).

    pip install py-spy          # not a project dependency; needs ptrace rights on the server
    python bench/profile_step.py [--steps 3000] [--top 30] [--kind print|reset]

``--kind reset`` profiles resets (copy-head easy, cached) instead of steps. The raw collapsed
stacks are kept in ``--raw`` (default /tmp/mechsandbox-profile.txt) for a flame graph.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import signal
import subprocess
import sys
import time

from mechsandbox.evaluation.local_server import LocalServer
from websockets.asyncio.client import connect

RESET = {"task_id": "copy-head", "level": "easy", "seed": 1}
IDLE = ("select", "epoll", "poll (", "wait (threading", "_worker (concurrent", "run_forever", "acquire")
WORKER_WAIT = "_recv_exact"  # the server blocked on the worker's socket: sandbox time, not server CPU


async def drive(url: str, steps: int, kind: str) -> float:
    async with connect(url.replace("http", "ws") + "/ws") as ws:
        await ws.send(json.dumps({"type": "reset", "data": RESET}))
        await ws.recv()
        started = time.perf_counter()
        for _ in range(steps):
            if kind == "reset":
                await ws.send(json.dumps({"type": "reset", "data": RESET}))
            else:
                await ws.send(json.dumps({"type": "step", "data": {"python_code": "print(1)"}}))
            await ws.recv()
        return time.perf_counter() - started


def summarize(raw: str, top: int) -> tuple[float, list[tuple[float, str]]]:
    """(share of samples waiting on the worker, [(inclusive share of server CPU samples, function)]) from
    py-spy's collapsed ``stack count`` lines; idle waits are dropped."""
    inclusive: collections.Counter[str] = collections.Counter()
    busy = waiting = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not count.isdigit() or any(marker in frames[-1] for marker in IDLE):
            continue
        if WORKER_WAIT in frames[-1]:
            waiting += int(count)
            continue
        busy += int(count)
        for name in set(frames):
            inclusive[name] += int(count)
    rows = [(n / max(busy, 1), name) for name, n in inclusive.most_common(top)]
    return waiting / max(busy + waiting, 1), rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--kind", choices=("print", "reset"), default="print")
    ap.add_argument("--raw", default="/tmp/mechsandbox-profile.txt")
    args = ap.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("py-spy is not installed: pip install py-spy")
    env = {"MECHSANDBOX_TRAIN_MAX_STEPS": str(args.steps + 10)}
    with LocalServer(env=env) as server:
        assert server.process is not None
        asyncio.run(drive(server.url, 1, "reset"))  # generate and cache the instance before sampling
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(server.process.pid), "--format", "raw",
                                "--rate", "500", "--output", args.raw, "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
        time.sleep(1.0)
        seconds = asyncio.run(drive(server.url, args.steps, args.kind))
        spy.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        _, err = spy.communicate(timeout=60)
    if spy.returncode not in (0, -signal.SIGINT):
        sys.exit(f"py-spy failed: {err.strip()[-500:]}")
    print(f"{args.steps} {args.kind} calls in {seconds:.2f} s: {1e3 * seconds / args.steps:.3f} ms each")
    with open(args.raw) as f:
        waiting, rows = summarize(f.read(), args.top)
    print(f"samples blocked on the worker's reply: {100 * waiting:.1f}% (of busy + blocked)")
    print("inclusive share of the server's CPU samples:")
    for share, name in rows:
        print(f"  {100 * share:5.1f}%  {name}")


if __name__ == "__main__":
    main()
