"""Soak: concurrent HTTP sessions mixing normal steps with hostile ones, against a running server.

Well-behaved sessions run snippets and submit the true answer of a train instance (the harness
generates it locally from the public seed); hostile sessions send infinite loops, loops that swallow
exceptions, memory bombs, huge output and attack snippets between normal steps. Well-behaved sessions
pause about 0.5 s between steps (an agent waiting for its model), so that about 10% of all steps are
hostile. Reported: steps, server 5xx (must be 0), well-behaved sessions that lost their
namespace or were graded wrong (must be 0), and the server's memory and process count over time.
Used by ``bench/soak.py`` (minutes) and ``tests/test_soak.py`` (about 30 s).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..tasks import get_family
from .procfs import children, cmdline, stat_fields

NORMAL = ("print(1)", "y = model(X)\nprint(y.shape)", "w = model[0].weight\nprint(float(w.abs().sum()) > 0)")
HOSTILE = (
    "while True:\n    pass",
    "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        x = 0",
    "xs = []\nwhile True:\n    xs.append(torch.ones(10 ** 7))",
    "while True:\n    print('x' * 1000)",
    "import os\nprint(os.environ)",
    "print(torch.from_file('/etc/passwd', False, 100))",
    "print(().__class__.__bases__[0].__subclasses__())",
    "x = torch.empty(10 ** 12)",
)
TASK = "dead-neurons"


@functools.cache
def truth(seed: int) -> list[int]:
    return get_family(TASK).generate(seed, "easy").truth["indices"]


@dataclass
class SoakReport:
    steps: int = 0
    hostile_steps: int = 0
    server_errors: int = 0
    episodes_graded: int = 0
    wrongly_graded: int = 0
    well_behaved_resets: int = 0
    other_failures: list[str] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for key, value in counts.items():
                setattr(self, key, getattr(self, key) + value)


def server_sample(server_pid: int) -> dict[str, Any]:
    """Server RSS, and the number of (zombie) children of the server and of its zygote."""
    with open(f"/proc/{server_pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024
    pids = children(server_pid, zombies=True)
    zygotes = [p for p in pids if b"sandbox.guest.zygote" in cmdline(p)]
    for zygote in zygotes:
        pids += children(zygote, zombies=True)
    states = [fields[0] for fields in map(stat_fields, pids) if fields]
    return {"time": time.monotonic(), "server_rss": rss, "processes": len(states), "zombies": states.count("Z")}


THINK_S = 0.5  # well-behaved sessions pause between steps, as an agent waiting for its model would


def _session(url: str, hostile: bool, stop: float, report: SoakReport, seed_base: int) -> None:
    rng = random.Random(seed_base)
    with httpx.Client(base_url=url, timeout=120) as http:
        episode = 0
        while time.monotonic() < stop:
            seed = seed_base * 1000 + episode
            episode += 1
            reset = http.post("/reset", json={"task_id": TASK, "seed": seed})
            if reset.status_code >= 500:
                report.add(server_errors=1)
                continue
            if reset.status_code != 200:
                report.other_failures.append(f"reset {reset.status_code}: {reset.text[:200]}")
                time.sleep(0.2)
                continue
            eid = reset.json()["episode_id"]
            for _ in range(4):
                if time.monotonic() >= stop:
                    break
                evil = hostile and rng.random() < 0.6
                code = rng.choice(HOSTILE if evil else NORMAL)
                if not hostile:
                    time.sleep(THINK_S * rng.random() * 2)
                step = http.post("/step", json={"action": {"python_code": code}, "episode_id": eid})
                report.add(steps=1, hostile_steps=int(evil), server_errors=int(step.status_code >= 500))
                if step.status_code == 200 and not hostile and step.json()["observation"]["namespace_reset"]:
                    report.add(well_behaved_resets=1)
            graded = http.post("/step", json={"action": {"solution_target": truth(seed)}, "episode_id": eid})
            report.add(steps=1, server_errors=int(graded.status_code >= 500))
            if graded.status_code == 200 and graded.json()["done"]:
                report.add(episodes_graded=1, wrongly_graded=int(graded.json()["reward"] < 0.95))


def run_soak(url: str, server_pid: int, seconds: float = 300.0, sessions: int = 16, hostile: int = 4) -> SoakReport:
    report = SoakReport()
    truth(0)
    stop = time.monotonic() + seconds
    threads = [threading.Thread(target=_session, args=(url, i < hostile, stop, report, i + 1)) for i in range(sessions)]
    for thread in threads:
        thread.start()
    report.samples.append(server_sample(server_pid))
    while any(t.is_alive() for t in threads):
        time.sleep(min(5.0, max(1.0, seconds / 10)))
        report.samples.append(server_sample(server_pid))
    for thread in threads:
        thread.join()
    time.sleep(2.0)  # let the reaper and the pool settle
    report.samples.append(server_sample(server_pid))
    return report
