"""Cache misses generated in child processes (server/generator_pool.py, issue 20): a miss a child generated is the
in-process instance bit for bit; no child starts for fast generations; a child killed mid-generation costs that
miss an in-process generation and one log line; children that cannot start stop being started; on a real server a
named-seed reset is generated in a child and plays."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

from helpers import assert_same_instance, wait_until
from mechsandbox.server.generator_pool import MAX_DEATHS, GeneratorPool
from mechsandbox.server.instance_cache import CachedInstance
from server_harness import running_server

SLOW = ("induction-circuit", "easy")  # about 0.15 s: over the pool's 50 ms, so the first child starts


def children() -> list[int]:
    """This process's generator children, read from /proc (what an operator's ps would show)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"mechsandbox.server.generator_process" in cmdline:
            found.append(int(entry.name))
    return found


def warm_child(pool: GeneratorPool) -> None:
    """A slow miss starts the first child; small misses then go on until one is generated in it (it is ready)."""
    pool(SLOW[0], 1, SLOW[1])
    assert pool.status()["in_server"] == 1 and pool.status()["processes"] == 1
    seeds = iter(range(10_000))
    wait_until(lambda: pool("dead-neurons", next(seeds), "easy") is not None and pool.status()["in_child"] >= 1)


def test_a_miss_generated_in_a_child_is_the_in_process_instance() -> None:
    pool = GeneratorPool(1)
    try:
        warm_child(pool)
        before = pool.status()["in_child"]
        item = pool("copy-head", 4321, "hard")
        assert pool.status()["in_child"] == before + 1  # the child made it, not the server
        assert item.payload.fd is not None  # the bytes went into the sealed file a reset hands to workers
    finally:
        pool.close()
    assert_same_instance(item, CachedInstance.build("copy-head", 4321, "hard"))
    wait_until(lambda: not children(), timeout_s=30)  # closed: the child is gone


def test_no_child_starts_while_every_generation_is_fast() -> None:
    pool = GeneratorPool(2)
    try:
        for seed in range(5):
            pool("dead-neurons", seed, "easy")  # about a millisecond each
        assert pool.status() == {"processes": 0, "busy": 0, "of": 2, "in_child": 0, "in_server": 5, "ended": 0}
        assert not children()
    finally:
        pool.close()


def test_a_child_killed_mid_generation_costs_one_in_process_generation(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="mechsandbox.server")
    pool = GeneratorPool(1)
    try:
        warm_child(pool)
        [pid] = children()
        got: list[CachedInstance] = []
        caller = threading.Thread(target=lambda: got.append(pool("committee-circuit", 77, "hard")))
        caller.start()
        wait_until(lambda: pool.status()["busy"] == 1, timeout_s=30)
        os.kill(pid, signal.SIGKILL)  # checked out for a generation that takes a second or more: whether the job
        # reached the child yet or not, its reply cannot have come
        caller.join(timeout=120)
        assert not caller.is_alive() and len(got) == 1
        status = pool.status()
        assert status["ended"] == 1 and status["busy"] == 0 and status["in_server"] >= 2  # the first miss and this one
        [line] = [r.getMessage() for r in caplog.records if "generator process ended" in r.getMessage()]
        assert "generated in the server process" in line
    finally:
        pool.close()
    assert_same_instance(got[0], CachedInstance.build("committee-circuit", 77, "hard"))


def test_children_that_cannot_start_stop_being_started(caplog) -> None:
    """A child that dies before it is ready (here: a thread count torch refuses) is dropped; after MAX_DEATHS none
    starts again, with one line saying so, and every miss is still served from the server's interpreter."""
    caplog.set_level(logging.ERROR, logger="mechsandbox.server")
    pool = GeneratorPool(2, threads=-1)
    seeds = iter(range(10_000))
    try:
        # each slow miss in the server starts a child when none is alive; the next miss finds it dead
        wait_until(lambda: pool(SLOW[0], next(seeds), SLOW[1]) is not None and pool.status()["ended"] == MAX_DEATHS)
        for _ in range(3):
            pool(SLOW[0], next(seeds), SLOW[1])
        status = pool.status()
        assert status["ended"] == MAX_DEATHS and status["processes"] == 0 and status["in_child"] == 0
        assert not children()
        lines = [r.getMessage() for r in caplog.records]
        assert sum("before it was ready" in line for line in lines) == MAX_DEATHS
        assert sum("none starts again" in line for line in lines) == 1
    finally:
        pool.close()


def test_a_named_seed_reset_on_a_server_is_generated_in_a_child(tmp_path) -> None:
    with running_server(tmp_path, MECHSANDBOX_GENERATORS="1") as server, server.http() as http:
        generators = lambda: http.get("/health").json()["generators"]  # noqa: E731
        seeds = iter(range(1000, 2000))

        def reset() -> dict:
            reply = http.post("/reset", json={"task_id": SLOW[0], "level": SLOW[1], "seed": next(seeds)})
            assert reply.status_code == 200, reply.text
            return reply.json()

        reset()  # generated in the server; it starts the child
        wait_until(lambda: generators()["processes"] == 1)
        wait_until(lambda: reset() is not None and generators()["in_child"] >= 1)
        episode = reset()  # the child is ready and idle: generated there
        assert generators()["in_child"] >= 2
        step = http.post("/step", json={"episode_id": episode["episode_id"],
                                        "action": {"python_code": "print(len(list(model.parameters())))"}})  # fmt: skip
        assert step.status_code == 200, step.text
        assert int(step.json()["observation"]["stdout_or_error"]) > 0  # the sandbox loaded the child's model
