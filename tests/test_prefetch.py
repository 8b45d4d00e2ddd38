"""Instances generated ahead (server/prefetch.py, issue 20): a prefetched instance is the on-demand one for its seed,
the pool keeps its bounds and refills, a failing generation or a dead generator thread leaves seedless resets
generating on demand with one log line, and on a real server a seedless reset with an instance ready does not
wait for generation (a generous bound: the figures live in bench/)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest
from helpers import assert_same_instance, wait_until
from mechsandbox.server.generator_process import GeneratorProcess
from mechsandbox.server.instance_cache import CachedInstance
from mechsandbox.server.prefetch import BuilderGone, Prefetcher
from mechsandbox.tasks import get_family
from server_harness import running_server


def test_a_prefetched_instance_is_the_on_demand_one_for_its_seed() -> None:
    prefetch = Prefetcher(depth=1, total=1, cpu_share=1.0).start()
    try:
        assert prefetch.take("copy-head", "medium") is None  # nothing ready yet: the pair is wanted from now on
        wait_until(lambda: prefetch.status()["ready"]["copy-head/medium"] == 1)
        item = prefetch.take("copy-head", "medium")
        assert item is not None
        fresh = CachedInstance.build("copy-head", item.instance.seed, "medium")
        assert item.payload.blob == fresh.payload.blob  # the weights' and probe tensors' bytes, as sent to the sandbox
        assert item.payload.header == fresh.payload.header  # the architecture and the probe's other values
        assert item.instance.truth == fresh.instance.truth and item.instance.prompt == fresh.instance.prompt
        assert (item.instance.task_id, item.instance.level) == ("copy-head", "medium")
    finally:
        prefetch.stop(wait_s=10)
    assert prefetch.take("copy-head", "medium") is None and not prefetch.status()["enabled"]  # stopped: on demand


def test_an_instance_handed_back_by_a_refused_reset_is_served_next_if_it_fits() -> None:
    pool = Prefetcher(depth=1, total=1, cpu_share=1.0)  # not started: no thread refills behind the test's back
    assert pool.take("dead-neurons", "easy") is None  # wanted from now on
    item = CachedInstance.build("dead-neurons", 7, "easy")
    pool.give_back(item)
    pool.give_back(CachedInstance.build("dead-neurons", 8, "easy"))  # past the depth: dropped
    assert pool.take("dead-neurons", "easy") is item and pool.take("dead-neurons", "easy") is None
    pool.give_back(CachedInstance.build("dead-neurons", 9, "medium"))  # a pair nobody wanted: dropped
    assert pool.status()["ready"] == {"dead-neurons/easy": 0}


def test_the_pool_keeps_its_bounds_and_refills() -> None:
    seen_totals: list[int] = []
    seeds = iter(range(10_000))

    def build(task_id: str, seed: int, level: str) -> CachedInstance:
        seen_totals.append(sum(prefetch.status()["ready"].values()))
        return CachedInstance.build(task_id, seed, level)

    prefetch = Prefetcher(depth=3, total=4, cpu_share=1.0, build=build, seed=lambda: next(seeds)).start()
    try:
        for level in ("easy", "medium"):
            assert prefetch.take("dead-neurons", level) is None
        wait_until(lambda: sum(prefetch.status()["ready"].values()) == 4)
        time.sleep(0.5)  # no generation past the bounds, however long it runs
        ready = prefetch.status()["ready"]
        assert sum(ready.values()) == 4 and max(ready.values()) <= 3 and prefetch.generated == 4, ready
        taken = [prefetch.take("dead-neurons", "easy"), prefetch.take("dead-neurons", "medium")]
        assert all(taken) and len({t.instance.seed for t in taken}) == 2 and prefetch.served == 2
        wait_until(lambda: sum(prefetch.status()["ready"].values()) == 4)  # refilled
        assert max(seen_totals) < 4  # a generation started only below the total
    finally:
        prefetch.stop()


class Crash(BaseException):
    """Not an Exception: what a bug or an interrupt in the generator thread looks like."""


def test_a_failing_generation_or_a_dead_thread_falls_back_to_on_demand(caplog) -> None:
    def build(task_id: str, seed: int, level: str) -> CachedInstance:
        if level == "hard":
            raise RuntimeError("planted failure")
        return CachedInstance.build(task_id, seed, level)

    caplog.set_level(logging.ERROR, logger="mechsandbox.server")
    prefetch = Prefetcher(depth=1, total=4, cpu_share=1.0, build=build).start()
    try:
        prefetch.take("dead-neurons", "hard")
        prefetch.take("dead-neurons", "easy")
        wait_until(lambda: prefetch.status()["ready"].get("dead-neurons/easy") == 1)
        wait_until(lambda: "dead-neurons/hard" in prefetch.status()["failed"])
        assert prefetch.take("dead-neurons", "hard") is None  # on demand from now on
        assert prefetch.take("dead-neurons", "easy") is not None  # the other pair still served
        [line] = [r.getMessage() for r in caplog.records if "planted failure" in r.getMessage()]
        assert "dead-neurons hard" in line and "generate on demand" in line
    finally:
        prefetch.stop()

    def crash(task_id: str, seed: int, level: str) -> CachedInstance:
        raise Crash("the generator thread died")

    # a generator thread that dies (a BaseException stands in for a kill: a thread cannot be killed from outside)
    dead = Prefetcher(depth=1, total=1, cpu_share=1.0, build=crash).start()
    dead.take("dead-neurons", "easy")
    wait_until(lambda: "stopped" in dead.status())
    assert dead.take("dead-neurons", "easy") is None and "Crash" in dead.status()["stopped"]
    assert any("instance prefetch stopped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("task_id", "level"), [("copy-head", "medium"), ("causal-subspace", "easy")])
def test_the_generator_process_gives_the_on_demand_instance(task_id: str, level: str) -> None:
    """What the child process sends back, rebuilt in the server (sealed file, model over a mapping of it), is the
    instance generated here: payload bytes and header, truth, prompt, every weight, the model's mode, and the same
    grade for the same answer (causal-subspace grades by running the server's model)."""
    process = GeneratorProcess()
    try:
        item = process(task_id, 1234, level)
    finally:
        process.close()
    fresh = CachedInstance.build(task_id, 1234, level)
    assert item.payload.fd is not None
    assert_same_instance(item, fresh)
    got, want = item.instance, fresh.instance
    if task_id == "causal-subspace":  # a partly right answer, so the score depends on the model's behaviour
        d = want.truth["d"]
        answer = [[1.0 if i in (0, 1) else 0.0 for i in range(d)], *want.truth["basis"]]
        family = get_family(task_id)
        assert family.grade(answer, got.truth, got).score == family.grade(answer, want.truth, want).score


def test_a_killed_generator_process_falls_back_to_on_demand(caplog) -> None:
    caplog.set_level(logging.ERROR, logger="mechsandbox.server")
    process = GeneratorProcess()
    prefetch = Prefetcher(depth=1, total=1, cpu_share=1.0, build=process).start()
    try:
        prefetch.take("dead-neurons", "easy")
        wait_until(lambda: prefetch.status()["ready"].get("dead-neurons/easy") == 1)
        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        assert prefetch.take("dead-neurons", "easy") is not None  # the one already made is still served
        wait_until(lambda: "stopped" in prefetch.status())
        assert prefetch.take("dead-neurons", "easy") is None  # on demand from now on
        assert "generator process ended" in prefetch.status()["stopped"]
        [line] = [r.getMessage() for r in caplog.records if "instance prefetch stopped" in r.getMessage()]
        assert "generator process ended" in line and "generates on demand" in line
    finally:
        prefetch.stop(wait_s=10)


def test_closing_the_generator_process_does_not_wait_for_its_generation() -> None:
    """A server that stops kills the child mid-generation instead of waiting for an instance it will not serve, and
    nothing restarts it."""
    process = GeneratorProcess()
    process("dead-neurons", 1, "easy")  # started and warm
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            process("committee-circuit", 77, "hard")  # seconds of work
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    time.sleep(0.3)  # committee-circuit hard takes a second or more: the call is waiting on the child
    process.close()
    caller.join(timeout=30)
    assert not caller.is_alive()
    # had close waited for the generation, the call would have returned its instance
    assert len(outcome) == 1 and isinstance(outcome[0], BuilderGone), outcome
    with pytest.raises(BuilderGone):
        process("dead-neurons", 2, "easy")
    assert process.pid is None


def test_the_cpu_share_makes_the_thread_rest_between_instances() -> None:
    done: list[float] = []

    def build(task_id: str, seed: int, level: str) -> CachedInstance:
        time.sleep(0.2)
        done.append(time.monotonic())
        return CachedInstance.build(task_id, seed, level)

    prefetch = Prefetcher(depth=3, total=3, cpu_share=0.25, build=build).start()
    try:
        prefetch.take("dead-neurons", "easy")
        wait_until(lambda: len(done) == 2, timeout_s=30)
        # at a quarter share, 0.2 s of work is followed by about 0.6 s of rest
        assert done[1] - done[0] >= 0.2 + 0.5, done
    finally:
        prefetch.stop()


def test_a_seedless_reset_on_a_server_takes_a_ready_instance(tmp_path) -> None:
    env = {"MECHSANDBOX_PREFETCH_DEPTH": "2", "MECHSANDBOX_PREFETCH_PAIRS": "committee-circuit/hard,dead-neurons/easy",
           "MECHSANDBOX_PREWARM_TEST": "dead-neurons/easy", "MECHSANDBOX_STANDARD_SET": "3",
           "MECHSANDBOX_SESSION_CAP": "4"}  # fmt: skip
    with running_server(tmp_path, **env) as server, server.http() as http:
        health = lambda: http.get("/health").json()["prefetch"]  # noqa: E731
        wait_until(lambda: health()["ready"].get("committee-circuit/hard", 0) >= 2, timeout_s=300)
        wait_until(lambda: health()["test_prewarm"] == {"done": 3, "of": 3}, timeout_s=60)

        def timed_reset(**params) -> tuple[float, dict]:
            started = time.monotonic()
            reply = http.post("/reset", json={"task_id": "committee-circuit", "level": "hard", **params})
            assert reply.status_code == 200, reply.text
            return time.monotonic() - started, reply.json()["observation"]

        # the same machine, the same moment: a reset that must generate against one served from the pool
        generating, _ = timed_reset(seed=123_456)
        served, obs = timed_reset()
        assert health()["served"] == 1
        assert served < generating / 2, (served, generating)  # did not wait for a generation (about 4 s idle)
        # the instance_id names the seed used: resetting that seed gives the same instance
        seed = int(obs["instance_id"].rsplit("-", 1)[1])
        _, again = timed_reset(seed=seed)
        assert again["instance_id"] == obs["instance_id"] and again["prompt"] == obs["prompt"]

        # a seedless reset refused after it took a ready instance (the session cap: four HTTP episodes are open)
        # hands the instance back: nothing counts as served, and the pool holds the same two
        wait_until(lambda: health()["ready"].get("dead-neurons/easy") == 2, timeout_s=60)
        assert http.post("/reset", json={"task_id": "dead-neurons", "seed": 5}).status_code == 200  # the fourth
        refused = http.post("/reset", json={"task_id": "dead-neurons", "level": "easy"})
        assert refused.status_code == 429, refused.text
        assert health()["served"] == 1 and health()["ready"]["dead-neurons/easy"] == 2


@pytest.mark.parametrize("bad", ["committee-circuit", "committee-circuit/hardest"])
def test_a_malformed_pair_setting_fails_at_startup_naming_it(bad: str) -> None:
    from mechsandbox.settings import ServerSettings

    with pytest.raises(ValueError, match="MECHSANDBOX_PREFETCH_PAIRS"):
        ServerSettings.from_env({"MECHSANDBOX_PREFETCH_PAIRS": bad})
