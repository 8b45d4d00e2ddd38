"""Test helpers: cached instances, a shared sandbox pool and a reference-solution runner.

Reference snippets run through the real sandbox (RestrictedPython policy, facades, a hardened
worker process) exactly as an agent's snippets would, and the answer comes back through
``solution_from("answer")``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from mechsandbox.answer_kind import AnswerKind
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
from mechsandbox.tasks import Family, Instance, families, get_family

FAMILY_IDS = [f.id for f in families()]
TRANSFORMER_FAMILIES = {"copy-head", "induction-circuit", "committee-circuit"}


def answer_kind(task_id: str) -> AnswerKind:
    return AnswerKind(get_family(task_id).answer_schema_fn("easy")["x-kind"])


SET_FAMILIES = [t for t in FAMILY_IDS if answer_kind(t).is_set]  # answers graded as sets (Jaccard)
HEAD_FAMILIES = {t for t in FAMILY_IDS if answer_kind(t).names_heads}


INSTANCE_CACHE_ENV = "MECHSANDBOX_TEST_INSTANCE_DIR"  # set by conftest for the whole run (all xdist workers)


def sweep_truths(task_id: str, level: str) -> list[dict[str, Any]]:
    """The truths of seeds 0..99 for the seed-variation rules: generated, or for a family whose truths are
    recorded (tests/sweep_truths.py says why), the first 40 generated and compared with the record, then the
    record's other 60. A mismatch fails here with the command that records them again."""
    return _swept(task_id, level, None)


def sweep_probe_facts(task_id: str, level: str) -> list[dict[str, Any]]:
    """What the family's tests read off the probes of seeds 0..99 (``sweep_truths.PROBE_FACTS``), generated or
    recorded as :func:`sweep_truths` is."""
    from sweep_truths import PROBE_FACTS

    return _swept(task_id, level, PROBE_FACTS[get_family(task_id).id])


def _swept(task_id: str, level: str, facts: Callable[[Instance], dict[str, Any]] | None) -> list[dict[str, Any]]:
    from sweep_truths import SEEDS, canonical, checked_seeds, recorded

    n = checked_seeds(task_id)
    made = [inst.truth if facts is None else json.loads(canonical(facts(inst)))
            for inst in cached_instances(task_id, range(n), level)]  # fmt: skip
    if n == SEEDS:
        return made
    record = recorded(task_id, level, facts is not None)
    what = "truth" if facts is None else "probe facts"
    for seed, (truth, kept) in enumerate(zip(made, record, strict=False)):
        assert canonical(truth) == canonical(kept), (
            f"{task_id} {level} seed {seed}: the generator's {what} differ from tests/sweep_truths.json; if the "
            "change is meant, record them again: python tests/sweep_truths.py --record"
        )
    return made + record[n:]


@functools.lru_cache(maxsize=256)
def cached_instance(task_id: str, seed: int, level: str) -> Instance:
    """Each (family, version, seed, level) is generated once per test run and shared by every test.

    Why: the seed sweeps alone need 3,600 instances, and several test files (run by several
    pytest-xdist workers) ask for the same ones. The first worker to need an instance generates it
    under a file lock and writes it to the run's cache folder; the others load it (a few ms against
    0.2-1.7 s of generation for the transformer families). The folder lives in the run's temporary
    directory and goes with it, so no stale instance outlives a change of a generator. Tests must
    not mutate the returned model.
    """
    inst = _from_disk(task_id, seed, level, wait=True)
    assert inst is not None
    return inst


def cached_instances(task_id: str, seeds: Iterable[int], level: str) -> list[Instance]:
    """``[cached_instance(task_id, s, level) for s in seeds]``, shared fairly between xdist workers.

    Why: two workers often sweep the same (family, level) at once (the 100-seed and the 40-seed
    tests). Walking the seeds in the same order, the second would wait on every lock the first
    holds. Here a seed that another process is generating right now is left for later, so the two
    split the sweep between them instead of taking turns.
    """
    seeds = list(seeds)
    found: dict[int, Instance] = {}
    for seed in seeds:
        inst = _from_disk(task_id, seed, level, wait=False)
        if inst is not None:
            found[seed] = inst
    return [found[seed] if seed in found else cached_instance(task_id, seed, level) for seed in seeds]


def _from_disk(task_id: str, seed: int, level: str, wait: bool) -> Instance | None:
    """Load the run's cached instance or generate and store it; None if another process holds it and
    ``wait`` is false."""
    fam = get_family(task_id)
    folder = os.environ.get(INSTANCE_CACHE_ENV)
    if not folder:
        return fam.generate(seed, level)
    path = Path(folder) / f"{fam.id}-v{fam.family_version}-{level}-{seed}.pt"
    with open(path.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return None
        if path.exists():
            return torch.load(path, weights_only=False)  # our own files, written by this run
        inst = fam.generate(seed, level)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save(inst, partial)
        os.replace(partial, path)
        return inst


@functools.cache
def shared_pool() -> SandboxPool:
    """One sandbox pool for the whole test session (closed at exit by conftest)."""
    return SandboxPool(SandboxSettings(pool_size=2, wall_seconds=60.0)).start()


def run_reference(family: Family, inst: Instance, noise: float = 0.0, noise_seed: int = 0) -> Any:
    """Play the family's reference snippets in a sandbox session; return the answer it submits."""
    if noise:  # perturb a copy: ``inst`` may be a cached instance that other tests share
        inst = dataclasses.replace(inst, model=copy.deepcopy(inst.model))
        gen = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for p in inst.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * noise)
    session = shared_pool().open_session(ModelPayload.from_instance(inst))
    try:
        out = []
        for i, code in enumerate(family.reference):
            result = session.run(code)
            assert result.error is None, f"{family.id} snippet {i}: {result.error}"
            out.append(result.stdout)
        answer, error = session.solution_from("answer")
        assert error is None, error
    finally:
        session.close()
    printed = json.loads("".join(out).strip().splitlines()[-1])
    assert printed == answer, "the last printed line is the submitted answer"
    return answer


def wait_until(check: Callable[[], bool], timeout_s: float = 120.0) -> None:
    """Poll ``check`` every 50 ms until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def assert_same_instance(item: Any, want: Any) -> None:
    """Two ``CachedInstance``s of one (task, seed, level) made in different places (a child process, the server) are
    the same: payload bytes and header, truth, prompt, config, answer schema, every weight and the model's mode."""
    assert item.payload.blob == want.payload.blob and item.payload.header == want.payload.header
    got, exp = item.instance, want.instance
    assert (got.truth, got.prompt, got.config, got.answer_schema) == (exp.truth, exp.prompt, exp.config,
                                                                      exp.answer_schema)  # fmt: skip
    weights = exp.model.state_dict()
    assert sorted(got.model.state_dict()) == sorted(weights)
    assert all(torch.equal(t, weights[k]) for k, t in got.model.state_dict().items())
    assert got.model.training == exp.model.training


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU for as long as the block runs: what a busy machine looks like (issue
    52's tests of what a user sees when other work shares the cores)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
