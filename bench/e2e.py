"""End-to-end latency and throughput through a running server, over WebSocket and HTTP, against two
floors measured with the same protocol in the same run: a plain FastAPI echo server and a minimal
OpenEnv echo environment.

    python bench/e2e.py [--n 300] [--sessions 1,8,32,64] [--steps 100]

Starts its own MechSandbox server (session cap 400, because every HTTP reset holds a session
until it ends or idles out; pool 8) and the two floor servers on free local ports. Latencies:
p50/p95/p99 over ``--n`` sequential calls (reset also in a burst of 16 sessions at once).
Throughput: each of k sessions resets, then all send ``--steps`` ``print(1)`` steps as fast as they
can; throughput = total steps / wall time of the step phase. The server runs with
``MECHSANDBOX_TRAIN_MAX_STEPS=1000`` so that 100 steps fit in one episode (copy-head easy allows 10);
a second figure repeats the run with a reset every 8 steps, as the family budget forces by default
(resets inside the step phase). One asyncio client process drives every server, so client overhead
is in every figure, floors included. ``--throughput-only`` skips the latencies and the floors.

The RL rows (issue 20: scripted episodes per second at concurrency 8 on fresh server-chosen seeds, with and
without instances generated ahead, and seedless reset latency per family and level while 8 sessions play) are
``bench/rl_load.py``; ``python bench/e2e.py --rl [its options]`` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
from mechsandbox.evaluation.local_server import LocalServer, free_port
from websockets.asyncio.client import connect

HERE = Path(__file__).resolve().parent
RESET = {"task_id": "copy-head", "level": "easy", "seed": 1}
BUDGET = 8  # copy-head easy allows 10 steps: reset every 8 (resets are part of the step phase)
POOL = 8  # warm sandbox workers of the server under test
FORWARD = "y = model(tokens)"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3


def fmt(xs: list[float]) -> str:
    return f"p50 {pct(xs, 0.5):8.3f}  p95 {pct(xs, 0.95):8.3f}  p99 {pct(xs, 0.99):8.3f} ms"


class Floor:
    """A floor server (uvicorn on a module in bench/floors) on a free port."""

    def __init__(self, module: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(HERE / "floors")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", f"{module}:app", "--port", str(self.port), "--log-level", "warning"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"floor {module} did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


async def ws_call(ws, message: dict) -> dict:
    await ws.send(json.dumps(message))
    reply = json.loads(await ws.recv())
    if reply.get("type") == "error":
        raise RuntimeError(reply)
    return reply


async def ws_latency(url: str, n: int, real: bool) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"reset": [], "print": [], "forward": [], "submit": []}
    async with connect(url.replace("http", "ws") + "/ws", max_size=2**24) as ws:
        for _ in range(max(10, n // 10)):
            t = time.perf_counter()
            await ws_call(ws, {"type": "reset", "data": RESET})
            out["reset"].append(time.perf_counter() - t)
        await ws_call(ws, {"type": "reset", "data": RESET})
        for key, code in (("print", "print(1)"), ("forward", FORWARD)):
            for i in range(n):
                if real and i % BUDGET == 0:  # stay inside the step budget
                    await ws_call(ws, {"type": "reset", "data": RESET})
                t = time.perf_counter()
                await ws_call(ws, {"type": "step", "data": {"python_code": code if real else "print(1)"}})
                out[key].append(time.perf_counter() - t)
        for _ in range(max(10, n // 10)):
            await ws_call(ws, {"type": "reset", "data": RESET})
            t = time.perf_counter()
            await ws_call(ws, {"type": "step", "data": {"solution_target": [[0, 0]]} if real else {"python_code": "1"}})
            out["submit"].append(time.perf_counter() - t)
    return out


def http_latency(url: str, n: int, real: bool) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"reset": [], "print": []}
    with httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(max(10, n // 10)):
            t = time.perf_counter()
            eid = client.post("/reset", json=RESET).json().get("episode_id")
            out["reset"].append(time.perf_counter() - t)
        eid = client.post("/reset", json=RESET).json().get("episode_id")
        for i in range(n):
            if real and i % BUDGET == 0:
                eid = client.post("/reset", json=RESET).json().get("episode_id")
            t = time.perf_counter()
            client.post("/step", json={"action": {"python_code": "print(1)"}, "episode_id": eid})
            out["print"].append(time.perf_counter() - t)
    return out


async def burst(url: str, k: int = 16) -> list[float]:
    async def one() -> float:
        async with connect(url.replace("http", "ws") + "/ws") as ws:
            t = time.perf_counter()
            await ws_call(ws, {"type": "reset", "data": {**RESET, "seed": 2}})
            return time.perf_counter() - t

    await asyncio.gather(*(one() for _ in range(2)))  # warm the instance cache
    return list(await asyncio.gather(*(one() for _ in range(k))))


def settle(url: str, warm: int, limit_s: float = 60) -> None:
    """Wait until the server has no model load under way and its warm pool is full again: resets answer before their
    loads (docs/SANDBOX.md), so a phase that starts right after a burst of resets would time their leftovers."""
    deadline = time.monotonic() + limit_s
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.monotonic() < deadline:
            workers = client.get("/health").json()["workers"]
            if workers["loading"] == 0 and workers["warm"] >= warm:
                return
            time.sleep(0.2)


async def throughput(url: str, sessions: int, steps: int, budget: int) -> float:
    ready = asyncio.Barrier(sessions + 1)
    done: list[float] = []

    async def session() -> None:
        async with connect(url.replace("http", "ws") + "/ws") as ws:
            await ws_call(ws, {"type": "reset", "data": RESET})
            await ready.wait()
            sent = 0
            while sent < steps:
                if sent and sent % (budget - 1) == 0:
                    await ws_call(ws, {"type": "reset", "data": RESET})
                await ws_call(ws, {"type": "step", "data": {"python_code": "print(1)"}})
                sent += 1
            done.append(time.perf_counter())

    tasks = [asyncio.create_task(session()) for _ in range(sessions)]
    await ready.wait()
    start = time.perf_counter()
    await asyncio.gather(*tasks)
    return sessions * steps / (max(done) - start)


def settled_throughput(url: str, real: bool, sessions: int, steps: int, budget: int) -> float:
    """``throughput``, on our server after it has settled (``settle``); a floor has nothing to settle."""
    if real:
        settle(url, POOL)
    return asyncio.run(throughput(url, sessions, steps, budget))


def main() -> None:
    if sys.argv[1:2] == ["--rl"]:
        import rl_load  # bench/ is the script's directory, first on sys.path

        sys.argv = [str(HERE / "rl_load.py"), *sys.argv[2:]]
        rl_load.main()
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--sessions", default="1,8,32,64")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--throughput-only", action="store_true", help="skip the latency figures and the floors")
    args = ap.parse_args()
    sessions = [int(s) for s in args.sessions.split(",")]
    env = {"MECHSANDBOX_SESSION_CAP": "400", "MECHSANDBOX_POOL_SIZE": str(POOL), "MECHSANDBOX_TRAIN_MAX_STEPS": "1000"}
    with ExitStack() as stack:
        ours = stack.enter_context(LocalServer(env=env))
        floors = {} if args.throughput_only else {name: Floor(name) for name in ("plain_echo", "openenv_echo")}
        for floor in floors.values():
            stack.callback(floor.stop)
        rows: dict[str, dict] = {}
        for name, url, real in (("mechsandbox", ours.url, True), *((n, f.url, False) for n, f in floors.items())):
            if args.throughput_only:
                ws, http, bursts = {}, {}, []
            else:
                ws, http = asyncio.run(ws_latency(url, args.n, real)), http_latency(url, args.n, real)
                bursts = asyncio.run(burst(url)) if real else []
            tput = {k: settled_throughput(url, real, k, args.steps, 10**9) for k in sessions}
            rows[name] = {"ws": ws, "http": http, "burst": bursts, "tput": tput}
            if real:  # the same with a reset every BUDGET steps, as the family budget (10) forces by default
                rows[name]["tput_budget"] = {k: settled_throughput(url, real, k, args.steps, BUDGET + 1)
                                             for k in sessions}  # fmt: skip
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; n={args.n}, steps/session={args.steps}")
    for name, row in rows.items():
        print(f"\n== {name}")
        for key, xs in row["ws"].items():
            if xs and (name == "mechsandbox" or key in ("reset", "print")):
                print(f"  WS   {key:8} {fmt(xs)}")
        for key, xs in row["http"].items():
            print(f"  HTTP {key:8} {fmt(xs)}")
        if row["burst"]:
            print(f"  WS   reset, burst of 16 sessions: {fmt(row['burst'])}")
        for k, value in row["tput"].items():
            print(f"  throughput, {k:2} sessions: {value:8.0f} print(1) steps/s")
        for k, value in row.get("tput_budget", {}).items():
            print(f"  throughput, {k:2} sessions, a reset every {BUDGET} steps: {value:8.0f} steps/s")
    ms = rows["mechsandbox"]
    if not floors:
        return
    print("\n== ratios (mechsandbox / floor), print(1) step p50 and throughput")
    for name in ("plain_echo", "openenv_echo"):
        fl = rows[name]
        ws_ratio = statistics.median(ms["ws"]["print"]) / statistics.median(fl["ws"]["print"])
        http_ratio = statistics.median(ms["http"]["print"]) / statistics.median(fl["http"]["print"])
        tput = ", ".join(f"{k}: {ms['tput'][k] / fl['tput'][k]:.2f}" for k in sessions)
        print(f"  vs {name:13} WS p50 x{ws_ratio:.2f}   HTTP p50 x{http_ratio:.2f}   throughput ratio {tput}")


if __name__ == "__main__":
    main()
