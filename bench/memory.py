"""Server and per-session memory through a running server.

    python bench/memory.py [--sessions 0,16,64]

For k sessions (WebSocket, copy-head easy), measures the server's RSS and each session worker's
private memory (Private_Clean + Private_Dirty) and PSS from /proc/<pid>/smaps_rollup, right after
reset + one ``print(1)`` and after the family's reference solution. Then: how many idle sessions fit
in the machine's RAM by the private-memory figure, and the worst case (session cap x address-space
limit) that the memory watchdog bounds. Needs to run as the same user as (or root over) the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics

import httpx
from mechsandbox.evaluation.local_server import LocalServer
from mechsandbox.evaluation.procfs import children, smaps_rollup, zygote_of
from mechsandbox.tasks import get_family
from websockets.asyncio.client import connect

RESET = {"task_id": "copy-head", "level": "easy", "seed": 1}


def address_space_limit(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max address space"):
                return int(line.split()[3])
    return 0


async def call(ws, message: dict) -> dict:
    await ws.send(json.dumps(message))
    return json.loads(await ws.recv())


def mib(x: float) -> str:
    return f"{x / 2**20:7.1f} MiB"


async def measure(server: LocalServer, k: int, reference: tuple[str, ...]) -> None:
    zygote = zygote_of(server.process.pid)
    warm_before = set(children(zygote))
    sockets = [await connect(server.url.replace("http", "ws") + "/ws", max_size=2**24) for _ in range(k)]
    for ws in sockets:
        await call(ws, {"type": "reset", "data": RESET})
        await call(ws, {"type": "step", "data": {"python_code": "print(1)"}})
    await asyncio.sleep(1.0)
    server_rss = smaps_rollup(server.process.pid)["Rss"]
    session_pids = [p for p in children(zygote) if p not in warm_before]
    idle = [smaps_rollup(p) for p in session_pids]
    line = f"{k:3} sessions: server RSS {mib(server_rss)}"
    if idle:
        private = [m.get("Private_Clean", 0) + m.get("Private_Dirty", 0) for m in idle]
        pss = statistics.fmean(m["Pss"] for m in idle)
        line += f"; per session after reset + print(1): private {mib(statistics.fmean(private))}"
        line += f" (max {mib(max(private))}), PSS {mib(pss)}"
        for ws in sockets:
            for code in reference:
                await call(ws, {"type": "step", "data": {"python_code": code}})
        await asyncio.sleep(0.5)
        used = [smaps_rollup(p) for p in session_pids if os.path.exists(f"/proc/{p}")]
        private_ref = [m.get("Private_Clean", 0) + m.get("Private_Dirty", 0) for m in used]
        line += f"; after the reference solution: private {mib(statistics.fmean(private_ref))}"
        idle_private = statistics.fmean(private)
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        line += (
            f"\n      -> idle sessions that fit in {ram / 2**30:.0f} GiB by private memory: {int(ram / idle_private)}"
        )
    print(line, flush=True)
    for ws in sockets:
        await ws.close()
    await asyncio.sleep(1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", default="0,16,64")
    args = ap.parse_args()
    reference = (*get_family("copy-head").reference[:-1], "answer = [[0, 0]]")
    with LocalServer(env={"MECHSANDBOX_SESSION_CAP": "80", "MECHSANDBOX_POOL_SIZE": "4"}) as server:
        for k in (int(s) for s in args.sessions.split(",")):
            asyncio.run(measure(server, k, reference))
        limit = address_space_limit(next(iter(children(zygote_of(server.process.pid)))))
        health = httpx.get(f"{server.url}/health").json()
    print(f"\nworst case: 64 sessions x {mib(limit)} address space = {64 * limit / 2**30:.0f} GiB of address space;")
    print("  the watchdog bounds what is actually used: all workers' private memory <= RAM - 4 GiB, largest killed")
    print(f"  (memory kills in this run: {health['memory_kills']})")


if __name__ == "__main__":
    main()
