"""Warm-up: tiny models of every registered architecture, loaded through the real load path.

Why: lazy imports, first-call initialisation and the caches of a first model load should happen in
the zygote before ``gc.freeze()`` (so every worker shares them copy-on-write) rather than in a worker
after it is sandboxed. The zygote loads each tiny model and runs ``WARM_UP`` against it; each worker
loads them once more after hardening, while it waits in the warm pool, so that most copy-on-write
page faults of a first load happen off the reset path (docs/PERFORMANCE.md: a first copy-head load
in a fresh worker took 7.9 ms, 4.2 ms after this).

The tiny models come from ``arch.ARCHITECTURES``, so a new architecture is warmed up as soon as it is
registered. Their payloads are built with ``ModelPayload.from_instance``, the path a session's model
takes, so describing, building and loading are all exercised. This module is its own so that the
zygote and the worker can both use it without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ....arch import ARCHITECTURES, build
from ..payload import ModelPayload
from .facade import Facade
from .runtime import Runtime

WARM_UP = """
import torch.nn.functional as G
from torch import nn as N
import numpy, math, json, itertools, collections, functools, statistics, heapq, random, re, copy
import einops
from transformer_lens import utils as tl_utils
x = torch.randn(6, 8)
y = model(sample)
print(y.shape, G.relu(x).sum(), torch.fft.rfft(x, dim=0).abs().sum(), torch.linalg.svd(x).S[0])
print(einops.rearrange(x, 'a (b c) -> (a b) c', c=2).shape, einops.reduce(x, 'a b -> b', 'max').shape,
      einops.einsum(x, x, 'a b, c b -> a c').shape, tl_utils.get_act_name('z', 0))
print(np.fft.rfft(x.detach().numpy(), axis=0).shape, np.linalg.svd(x.numpy())[1][0], np.asarray(x).mean())
w = torch.zeros(3, requires_grad=True)
opt = torch.optim.Adam([w], lr=0.1)
loss = ((w - 1) ** 2).sum()
loss.backward()
opt.step()
print(torch.autograd.grad((x.requires_grad_(True) ** 2).sum(), x)[0].shape)
if hasattr(model, 'cfg'):
    logits, cache = model.run_with_cache(sample)
    print(cache['pattern', 0].shape, utils.get_act_name('z', 0))
    def hook(z, hook):
        z[:, :, 0] = 0.0
        return z
    model.run_with_hooks(sample, fwd_hooks=[(lambda name: name.endswith('hook_z'), hook)])
print(f"{1.5:.3f}", "{:.2f}".format(2.5), sorted(zip([2, 1], [3, 4])), dir(torch)[:2], type(x))
help(torch.relu)
warning_source = torch.tensor([1.0]).new_tensor(torch.tensor([2.0]))
"""


@dataclass(frozen=True)
class _TinyInstance:
    """The public parts of a warm-up "instance": an untrained tiny model and a sample input batch."""

    model: nn.Module
    probe: dict[str, Any]


def warm_up_payloads() -> list[ModelPayload]:
    """One payload per registered architecture (in registry order), built once in the zygote."""
    payloads = []
    for arch in ARCHITECTURES.values():
        record = arch.tiny_record()
        tiny = _TinyInstance(build(record), {"sample": arch.sample(record)})
        payloads.append(ModelPayload.from_instance(tiny, sealed=False))  # no descriptor for every worker to inherit
    return payloads


def warm_up(facades: dict[str, Facade], payloads: Sequence[ModelPayload], snippet: str | None) -> None:
    """Load each payload into a fresh runtime (and run ``snippet`` against it, when given)."""
    for payload in payloads:
        runtime = Runtime(facades)
        runtime.load(payload.header, payload.blob)
        result = runtime.run(snippet) if snippet else {"error": None}
        if result["error"]:
            raise RuntimeError(f"sandbox warm-up failed for {payload.header['arch']['class']}: {result['error']}")
