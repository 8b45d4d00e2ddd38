"""Test helpers: cached instances and a reference-solution runner.

Until the sandbox exists (issue 3), reference snippets are compiled with RestrictedPython's
``compile_restricted_exec`` (so they stay sandbox-compatible) and then run with plain ``exec`` in
one persistent namespace, as a notebook would.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from mechsandbox.tasks import Family, Instance, families, get_family
from RestrictedPython import compile_restricted_exec
from torch import nn

FAMILY_IDS = [f.id for f in families()]
TRANSFORMER_FAMILIES = {"copy-head", "induction-circuit", "committee-circuit"}


@functools.cache
def cached_instance(task_id: str, seed: int, level: str) -> Instance:
    """Generated once per test session; tests must not mutate the returned model."""
    return get_family(task_id).generate(seed, level)


def run_snippets(snippets: tuple[str, ...] | list[str], namespace: dict[str, Any]) -> tuple[dict, str]:
    ns = {"torch": torch, "np": np, "nn": nn, "F": F, "json": json, "math": math, **namespace}
    out = io.StringIO()
    for i, code in enumerate(snippets):
        result = compile_restricted_exec(code, filename=f"<snippet {i}>")
        assert not result.errors, f"snippet {i} is not RestrictedPython-compatible: {result.errors}"
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"<snippet {i}>", "exec"), ns)
    return ns, out.getvalue()


def run_reference(family: Family, inst: Instance, noise: float = 0.0, noise_seed: int = 0) -> Any:
    """Play the family's reference snippets against the instance; return the answer it submits."""
    if noise:
        gen = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for p in inst.model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * noise)
    torch.manual_seed(noise_seed)
    ns, out = run_snippets(family.reference, inst.public_namespace())
    printed = json.loads(out.strip().splitlines()[-1])
    assert printed == json.loads(json.dumps(ns["answer"])), "the last printed line is the submitted answer"
    return ns["answer"]
