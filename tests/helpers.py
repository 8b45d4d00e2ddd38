"""Test helpers: cached instances, a shared sandbox pool and a reference-solution runner.

Reference snippets run through the real sandbox (RestrictedPython policy, facades, a hardened
worker process) exactly as an agent's snippets would, and the answer comes back through
``solution_from("answer")``.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import torch
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
from mechsandbox.tasks import Family, Instance, families, get_family

FAMILY_IDS = [f.id for f in families()]
TRANSFORMER_FAMILIES = {"copy-head", "induction-circuit", "committee-circuit"}
SET_KINDS = ("indices", "frequencies", "heads", "heads+roles")


def answer_kind(task_id: str) -> str:
    return get_family(task_id).answer_schema_fn("easy")["x-kind"]


SET_FAMILIES = [t for t in FAMILY_IDS if answer_kind(t) in SET_KINDS]  # answers graded as sets (Jaccard)
HEAD_FAMILIES = {t for t in FAMILY_IDS if answer_kind(t).startswith("heads")}


@functools.cache
def cached_instance(task_id: str, seed: int, level: str) -> Instance:
    """Generated once per test session; tests must not mutate the returned model."""
    return get_family(task_id).generate(seed, level)


@functools.cache
def shared_pool() -> SandboxPool:
    """One sandbox pool for the whole test session (closed at exit by conftest)."""
    return SandboxPool(SandboxSettings(pool_size=2, wall_seconds=60.0)).start()


def run_reference(family: Family, inst: Instance, noise: float = 0.0, noise_seed: int = 0) -> Any:
    """Play the family's reference snippets in a sandbox session; return the answer it submits."""
    if noise:
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
