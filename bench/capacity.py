"""What one machine holds (issue 52, "Load held"): N live episodes at once, what the idle ones cost, and how fast the
active ones step against an echo server measured in the same run at the same concurrency.

    OMP_NUM_THREADS=1 python bench/capacity.py [--episodes 256] [--active 8,32,64] [--idle-s 20] [--steps 40]

Starts a real server (``mechsandbox serve``: session cap = ``--episodes``, every other setting at its default;
loopback is exempt from the per-client share) and the plain FastAPI echo floor of ``bench/e2e.py``. Then:

1. opens ``--episodes`` WebSocket episodes, the families of ``--families`` in turn (a few cached seeds each), each
   reset and given one ``print(1)`` so that its sandbox worker holds the model;
2. memory: every sandbox worker's private memory (Private_Clean + Private_Dirty, /proc/<pid>/smaps_rollup) and PSS,
   summed and divided by the live episodes (the warm pool's workers are in the sum: an upper bound), and the
   server's own growth (private memory, RSS) while the last episodes opened (the first few cached the instances);
3. idle CPU: utime + stime of the server and of every process under it (zygote, workers, generators) over
   ``--idle-s`` seconds while all the episodes sit idle (sockets open, no messages);
4. active: for each K of ``--active``, K of the live episodes (every family) step at once, ``--steps`` each, first
   ``print(1)``, then a small forward pass (8 rows of the family's probe), while the others stay idle; K connections
   to the echo server do as many round trips with the same client library -> p50 / p95, the ratios to the echo's,
   and the CPU each step cost the server, the workers and the client (``/proc/<pid>/task/*/schedstat``).

One asyncio client process drives everything (its CPU is in every figure, the echo's included). ``--check`` exits
non-zero when an episode could not be opened, a step failed or the watchdog killed a worker (figures printed anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import typing
from dataclasses import dataclass, field

import httpx
from e2e import Floor, settle  # bench/ is the script's directory, first on sys.path
from mechsandbox.evaluation.local_server import LocalServer
from mechsandbox.evaluation.procfs import children, smaps_rollup, stat_fields, zygote_of
from websockets.asyncio.client import ClientConnection, connect

T = typing.TypeVar("T")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MIB = 2**20
# a small forward pass per family: 8 rows of the probe input its namespace holds (tasks/*/generator.py, ``probe=``)
FORWARD = {
    "dead-neurons": "y = model(X[:8])",
    "superposition": "y = model(x[:8])",
    "causal-subspace": "y = model(x[:8])",
    "fourier-frequencies": "y = model(tokens[:8])",
    "copy-head": "y = model(tokens[:8])",
    "induction-circuit": "y = model(tokens[:8])",
}
SEEDS = 4  # seeds per family: the instance cache (64) keeps them all, so opening an episode never generates twice


@dataclass
class Episode:
    family: str
    ws: ClientConnection
    errors: list[str] = field(default_factory=list)


async def call(ws: ClientConnection, message: dict) -> dict:
    await ws.send(json.dumps(message))
    reply = json.loads(await ws.recv())
    if reply.get("type") == "error":
        raise RuntimeError(str(reply.get("data", reply))[:200])
    return reply


def step(code: str) -> dict:
    return {"type": "step", "data": {"python_code": code}}


async def open_episodes(
    url: str, families: list[str], n: int, parallel: int, offset: int = 0
) -> tuple[list[Episode], list[str]]:
    """Episodes ``offset`` to ``offset + n - 1``, ``parallel`` being opened at a time; each reset and stepped once (its
    worker loaded). Episode i plays family i mod len(families) on one of ``SEEDS`` seeds."""
    gate = asyncio.Semaphore(parallel)
    failures: list[str] = []

    async def one(i: int) -> Episode | None:
        family = families[i % len(families)]
        reset = {"task_id": family, "level": "easy", "seed": 1 + (i // len(families)) % SEEDS, "split": "train"}
        async with gate:
            ws = None
            try:
                ws = await connect(url.replace("http", "ws") + "/ws", max_size=2**24, open_timeout=120)
                await call(ws, {"type": "reset", "data": reset})
                reply = await call(ws, step("print(1)"))
                if "1" not in json.dumps(reply):
                    raise RuntimeError(f"unexpected step reply {json.dumps(reply)[:160]}")
                return Episode(family, ws)
            except Exception as exc:  # a bench: count it, report it, go on
                failures.append(f"episode {i} ({family}): {type(exc).__name__}: {exc}"[:240])
                if ws is not None:
                    await ws.close()
                return None

    opened = await asyncio.gather(*(one(i) for i in range(offset, offset + n)))
    return [e for e in opened if e is not None], failures


def descendants(root: int) -> list[int]:
    """Every process under ``root`` (children, grandchildren...), from one pass over /proc."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields:
                parent[int(entry)] = int(fields[1])
    out, frontier = [], [root]
    while frontier:
        nxt = [pid for pid, ppid in parent.items() if ppid in frontier]
        out += nxt
        frontier = nxt
    return out


def cpu_seconds(pid: int) -> float:
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS if fields else 0.0


def private(pid: int) -> tuple[int, int, int, int]:
    """(private, PSS, Anonymous + Pss_Shmem, Pss_Anon + Pss_Shmem) bytes of a process (smaps_rollup); zeros once it is
    gone."""
    try:
        m = smaps_rollup(pid)
    except OSError:
        return 0, 0, 0, 0
    private = m.get("Private_Clean", 0) + m.get("Private_Dirty", 0)
    return private, m.get("Pss", 0), m["Anonymous"] + m["Pss_Shmem"], m["Pss_Anon"] + m["Pss_Shmem"]


def soft_nofile(pid: int) -> str:
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return line.split()[3]
    return "?"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


async def timed_steps(episodes: list[Episode], steps: int, kind: str) -> list[float]:
    """Every episode sends ``steps`` steps of ``kind`` (``print``, ``forward``, or ``echo`` for the floor) at once;
    the latencies in seconds."""
    out: list[float] = []
    start = asyncio.Barrier(len(episodes))

    async def one(ep: Episode) -> None:
        code = FORWARD[ep.family] if kind == "forward" else "print(1)"
        await start.wait()
        for _ in range(steps):
            t = time.perf_counter()
            try:
                reply = await call(ep.ws, step(code))
            except Exception as exc:
                ep.errors.append(f"{type(exc).__name__}: {exc}"[:160])
                return
            out.append(time.perf_counter() - t)
            observation = reply.get("data", {}).get("observation", {}) if kind != "echo" else {}
            if observation.get("error") or observation.get("namespace_reset"):
                ep.errors.append(str(observation.get("error") or "namespace reset")[:160])

    await asyncio.gather(*(one(ep) for ep in episodes))
    return out


def run_time(pid: int) -> float:
    """Seconds on a CPU of every live thread of ``pid`` (/proc/<pid>/task/*/schedstat, in nanoseconds: /proc/<pid>/stat
    counts 10 ms ticks, too coarse for a few hundred echo steps)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


async def with_cpu(work: typing.Awaitable[T], groups: list[list[int]]) -> tuple[T, list[float]]:
    """``work``'s result and the CPU seconds each group of processes spent on it, then this client process's."""
    before, mine = [sum(run_time(p) for p in group) for group in groups], time.process_time()
    result = await work
    after, now = [sum(run_time(p) for p in group) for group in groups], time.process_time()
    return result, [a - b for a, b in zip(after, before, strict=True)] + [now - mine]


async def echo_round(url: str, k: int, steps: int) -> list[float]:
    sockets = [await connect(url.replace("http", "ws") + "/ws") for _ in range(k)]
    try:
        return await timed_steps([Episode("echo", ws) for ws in sockets], steps, "echo")
    finally:
        for ws in sockets:
            await ws.close()


async def idle_cpu(server_pid: int, workers: list[int], seconds: float) -> tuple[float, float, float, float, float]:
    """(wall, server, all workers, the busiest worker, other children) CPU seconds over ``seconds`` of idling."""
    procs = [server_pid, *descendants(server_pid)]
    before = {pid: cpu_seconds(pid) for pid in procs}
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)  # the client keeps answering the server's keepalive pings meanwhile
    wall = time.perf_counter() - t0
    spent = {pid: max(0.0, cpu_seconds(pid) - before[pid]) for pid in procs}  # a process gone reads 0
    in_workers = [spent.get(pid, 0.0) for pid in workers]
    others = sum(spent.values()) - sum(in_workers) - spent[server_pid]
    return wall, spent[server_pid], sum(in_workers), max(in_workers, default=0.0), others


def statm_private(pid: int) -> int:
    """Resident minus shared pages (/proc/<pid>/statm): what the memory watchdog counted before issue 53."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            parts = f.read().split()
        return (int(parts[1]) - int(parts[2])) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def cgroup_charge(pid: int) -> int | None:
    """rss + shmem (v1) or anon + shmem (v2) charged to the process's memory cgroup, when it has one of its own (the
    watchdog's count where the pool has a memory cgroup per slot, issue 53); None otherwise."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "slot-" not in path:
            continue
        if controllers == "memory":
            stat, keys = f"/sys/fs/cgroup/memory{path}/memory.stat", ("rss", "shmem")
        elif controllers == "":
            stat, keys = f"/sys/fs/cgroup{path}/memory.stat", ("anon", "shmem")
        else:
            continue
        try:
            with open(stat) as f:
                values = dict(line.split() for line in f if line.count(" ") == 1)
            return sum(int(values[key]) for key in keys)
        except (OSError, KeyError, ValueError):
            return None
    return None


def open_files(pid: int) -> str:
    """How many descriptors a process holds and its highest one (``select.select`` fails from 1024 on)."""
    try:
        fds = [int(fd) for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return "?"
    return f"{len(fds)} (highest {max(fds)})"


async def measure(args: argparse.Namespace, server: LocalServer, echo: Floor) -> int:
    families = args.families.split(",")
    pid = server.process.pid
    zygote = zygote_of(pid)
    # the first episodes generate the instances (a few at a time); the rest find them cached, so opening them times
    # admission and loads, not generation
    first = min(args.episodes, len(families) * SEEDS)
    episodes, failures = await open_episodes(server.url, families, first, parallel=2)
    await asyncio.to_thread(settle, server.url, 1)
    server_before = private(pid)[0], smaps_rollup(pid)["Rss"]
    files_before = open_files(pid)
    wall, base_server, base_workers, _, _ = await idle_cpu(pid, children(zygote), min(args.idle_s, 10))
    print(f"{len(episodes)} episodes: server idle CPU {base_server:.2f} s over {wall:.0f} s "
          f"({100 * base_server / wall:.2f}% of a core), warm workers {base_workers:.2f} s; {files_before} open files",
          flush=True)  # fmt: skip
    t = time.perf_counter()
    more, failed = await open_episodes(
        server.url, families, args.episodes - first, parallel=args.parallel, offset=first
    )
    episodes, failures = episodes + more, failures + failed
    opened_s = time.perf_counter() - t
    print(f"opened {len(episodes)} / {args.episodes} live episodes (the last {args.episodes - first}: {opened_s:.1f} s)"
          f" {', '.join(f'{f}: {sum(e.family == f for e in episodes)}' for f in families)}", flush=True)  # fmt: skip
    for line in failures[:5]:
        print(f"  failed: {line}")
    await asyncio.sleep(3.0)  # loads behind and the warm pool's refill end
    await asyncio.to_thread(settle, server.url, 1)
    health = (await asyncio.to_thread(httpx.get, f"{server.url}/health", timeout=30)).json()
    print(f"server: {health['sessions']}; workers {health['workers']}; memory kills {health['memory_kills']}; "
          f"open files {open_files(pid)} (soft limit {soft_nofile(pid)})", flush=True)  # fmt: skip

    workers = children(zygote)
    memory = [private(w) for w in workers]
    n, added = max(1, len(episodes)), max(1, len(episodes) - first)
    total_private, total_pss = sum(m[0] for m in memory), sum(m[1] for m in memory)
    server_after = private(pid)[0], smaps_rollup(pid)["Rss"]
    growth = server_after[0] - server_before[0], server_after[1] - server_before[1]
    print(f"\nmemory, {len(workers)} sandbox workers for {len(episodes)} idle episodes (warm pool included):")
    print(f"  workers' private memory: {total_private / MIB:.0f} MiB in all, {total_private / n / MIB:.2f} MiB per "
          f"episode (median worker {statistics.median(m[0] for m in memory) / MIB:.2f}, "
          f"max {max(m[0] for m in memory) / MIB:.2f} MiB); PSS {total_pss / n / MIB:.2f} MiB per episode")  # fmt: skip
    print(f"  server: private {server_before[0] / MIB:.0f} -> {server_after[0] / MIB:.0f} MiB "
          f"with the last {added} episodes (+{growth[0] / added / MIB:.2f} MiB each), RSS "
          f"{server_before[1] / MIB:.0f} -> {server_after[1] / MIB:.0f} MiB")  # fmt: skip
    per_episode = (total_private / n + growth[0] / added) / MIB
    print(f"  per idle episode, workers + the server's growth: {per_episode:.2f} MiB private")
    counts = {"statm resident - shared (the watchdog before issue 53)": [statm_private(w) for w in workers],
              "smaps Anonymous + Pss_Shmem (issue 53's fallback)": [m[2] for m in memory],
              "smaps Pss_Anon + Pss_Shmem (shared pages split among mappers)": [m[3] for m in memory]}  # fmt: skip
    charged = [cgroup_charge(w) for w in workers]
    if None not in charged:
        counts["the slot's memory cgroup, rss + shmem (issue 53)"] = typing.cast(list[int], charged)
    print(f"  what a memory watchdog counts, against the budget of {args.budget_mib:.0f} MiB:")
    for name, values in counts.items():
        print(f"    {name}: {sum(values) / MIB:.0f} MiB in all, {sum(values) / len(values) / MIB:.1f} MiB per worker")

    wall, in_server, in_workers, busiest, others = await idle_cpu(pid, workers, args.idle_s)
    print(f"\nidle CPU over {wall:.0f} s ({len(episodes)} idle episodes): server {in_server:.2f} s "
          f"({100 * in_server / wall:.2f}% of a core), {len(workers)} workers {in_workers:.2f} s in all "
          f"(the busiest {busiest:.2f} s), other children {others:.2f} s", flush=True)  # fmt: skip

    print("\nactive episodes among the idle ones: step latency, ms (echo: the plain FastAPI floor, same client)")
    print(
        f"  {'K':>3}  {'kind':8} {'p50':>8} {'p95':>8} {'echo p50':>9} {'echo p95':>9} {'x p50':>6} {'x p95':>6}   "
        "CPU per step, ms: server / workers / client"
    )
    step_errors = 0
    for k in (int(s) for s in args.active.split(",")):
        active = episodes[:k]  # spread over the families: episodes alternate between them
        floor, floor_cpu = await with_cpu(echo_round(echo.url, k, args.steps), [[echo.process.pid]])
        e50, e95 = pct(floor, 0.5), pct(floor, 0.95)
        for kind in ("print", "forward"):
            await asyncio.to_thread(settle, server.url, 1)
            ours, cpu = await with_cpu(timed_steps(active, args.steps, kind), [[pid], descendants(pid)])
            p50, p95 = pct(ours, 0.5), pct(ours, 0.95)
            per_step = [1e3 * x / max(1, len(ours)) for x in cpu]
            print(f"  {k:3}  {kind:8} {p50:8.2f} {p95:8.2f} {e50:9.2f} {e95:9.2f} {p50 / e50:6.1f} {p95 / e95:6.1f}   "
                  f"{per_step[0]:.2f} / {per_step[1]:.2f} / {per_step[2]:.2f}", flush=True)  # fmt: skip
        echo_cpu = [1e3 * x / max(1, len(floor)) for x in floor_cpu]
        print(f"       echo CPU per step, ms: {echo_cpu[0]:.2f} (server) / {echo_cpu[1]:.2f} (client); load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
        errors = [e for ep in active for e in ep.errors]
        step_errors += len(errors)
        if errors:
            print(f"      {len(errors)} failed steps, e.g. {errors[0]}")
        for ep in active:
            ep.errors.clear()
    health = (await asyncio.to_thread(httpx.get, f"{server.url}/health", timeout=30)).json()
    print(f"\nafter: sessions {health['sessions']}; workers {health['workers']}; memory kills {health['memory_kills']}")
    kills = health["memory_kills"]
    for ep in episodes:
        await ep.ws.close()
    return 1 if failures or step_errors or kills else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--active", default="8,32,64", help="concurrently stepping episodes, comma list")
    ap.add_argument("--steps", type=int, default=40, help="steps per active episode and K (half print, half forward)")
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--families", default="dead-neurons,superposition,copy-head,induction-circuit")
    ap.add_argument("--parallel", type=int, default=16, help="episodes being opened at a time")
    ap.add_argument("--memory-budget-mb", type=int, default=None, help="MECHSANDBOX_MEMORY_BUDGET_MB (default: the "
                    "server's, RAM minus 4 GiB)")  # fmt: skip
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="more server settings")
    ap.add_argument("--check", action="store_true", help="exit 1 when an episode could not open or a step failed")
    args = ap.parse_args()
    unknown = [f for f in args.families.split(",") if f not in FORWARD]
    if unknown:
        sys.exit(f"no forward snippet for {unknown}; known: {', '.join(FORWARD)}")
    env = {"MECHSANDBOX_SESSION_CAP": str(args.episodes), "MECHSANDBOX_TRAIN_MAX_STEPS": "10000",
           "MECHSANDBOX_PREFETCH_DEPTH": "0"}  # fmt: skip
    env |= dict(item.split("=", 1) for item in args.env)
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    args.budget_mib = max(ram - 4 * 2**30, 2**30) / MIB
    if args.memory_budget_mb is not None:
        env["MECHSANDBOX_MEMORY_BUDGET_MB"] = str(args.memory_budget_mb)
        args.budget_mib = args.memory_budget_mb
    print(f"machine: {os.cpu_count()} cores, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} "
          f"GiB; server env {env}", flush=True)  # fmt: skip
    log_path = os.environ.get("CAPACITY_SERVER_LOG", "/tmp/capacity-server.log")
    echo = Floor("plain_echo")
    try:
        with LocalServer(env=env, log_path=log_path) as server:
            status = asyncio.run(measure(args, server, echo))
    finally:
        echo.stop()
    print(f"server log: {log_path}")
    sys.exit(status if args.check else 0)


if __name__ == "__main__":
    main()
