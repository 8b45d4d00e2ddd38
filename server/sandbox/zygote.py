"""The zygote: a clean, secret-free process that preloads everything and forks workers on request.

The server starts it with ``subprocess`` (fork+exec of a fresh interpreter, never a fork of the
server), with a scrubbed environment, and talks to it over a SOCK_SEQPACKET control socket. It
imports torch, numpy, RestrictedPython, the facades and every family's model classes, runs a warm-up
snippet so lazy imports and first-call initialisation happen before any worker is sandboxed, calls
``gc.freeze()`` (so copy-on-write pages stay shared), and then answers ``spawn`` requests: for each
it makes a socketpair, forks, hands the worker one end and passes the other end back to the server
with SCM_RIGHTS. It never sees a seed, a truth or a test salt.

Run as ``python -I -m mechsandbox.server.sandbox.zygote '<json config>'``.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import sys
from typing import Any

WARM_UP = """
import torch.nn.functional as G
from torch import nn as N
import numpy, math, json, itertools, collections, functools, statistics, heapq, random, re, copy
x = torch.randn(6, 8)
y = model(tokens) if hasattr(model, 'cfg') else model(x[:, :4])
print(y.shape, G.relu(x).sum(), torch.fft.rfft(x, dim=0).abs().sum(), torch.linalg.svd(x).S[0])
print(np.fft.rfft(x.detach().numpy(), axis=0).shape, np.linalg.svd(x.numpy())[1][0], np.asarray(x).mean())
w = torch.zeros(3, requires_grad=True)
opt = torch.optim.Adam([w], lr=0.1)
loss = ((w - 1) ** 2).sum()
loss.backward()
opt.step()
print(torch.autograd.grad((x.requires_grad_(True) ** 2).sum(), x)[0].shape)
if hasattr(model, 'cfg'):
    logits, cache = model.run_with_cache(tokens)
    print(cache['pattern', 0].shape, utils.get_act_name('z', 0))
    def hook(z, hook):
        z[:, :, 0] = 0.0
        return z
    model.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith('hook_z'), hook)])
print(f"{1.5:.3f}", "{:.2f}".format(2.5), sorted(zip([2, 1], [3, 4])), dir(torch)[:2], type(x))
help(torch.relu)
warning_source = torch.tensor([1.0]).new_tensor(torch.tensor([2.0]))
"""


TINY_ARCHITECTURES = (
    {
        "class": "HookedTransformer",
        "cfg": {"n_layers": 1, "n_heads": 2, "d_model": 8, "d_head": 4, "d_vocab": 10, "n_ctx": 5},
    },
    {"class": "GatedMLP", "n_in": 4, "d_hidden": 6, "n_out": 2},
)


def warm_up_payloads() -> list[tuple[dict[str, Any], bytes]]:
    """(header, safetensors bytes) of a tiny model per architecture, built once in the zygote."""
    import torch
    from safetensors.torch import save

    from ...arch import build

    payloads = []
    for arch in TINY_ARCHITECTURES:
        tensors = {f"model.{k}": v for k, v in build(arch).state_dict().items()}
        tensors["probe.tokens"] = torch.randint(0, 10, (2, 5))
        payloads.append(({"arch": arch, "probe": {}}, save(tensors)))
    return payloads


def warm_up(facades: dict[str, Any], payloads: list[tuple[dict[str, Any], bytes]], snippet: str | None) -> None:
    """Load tiny models through the real load path (and run ``snippet`` against each, when given).

    The zygote runs it with representative snippets so that lazy imports and caches exist before
    ``gc.freeze()``. Each worker runs the load part again after hardening, while it waits in the warm
    pool, so that most copy-on-write page faults of a first load happen off the reset path
    (docs/PERFORMANCE.md: a first copy-head load in a fresh worker took 7.9 ms, 4.2 ms after this).
    """
    from .runtime import Runtime

    for header, blob in payloads:
        runtime = Runtime(facades)
        runtime.load(header, blob)
        result = runtime.run(snippet) if snippet else {"error": None}
        if result["error"]:
            raise RuntimeError(f"sandbox warm-up failed: {result['error']}")


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    from .hardening import HardeningConfig, library_paths, set_parent_death_signal

    set_parent_death_signal(int(config["parent"]))
    control = socket.socket(fileno=int(config["fd"]))

    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    from . import seccomp, worker
    from .facade import build_facades

    seccomp.available()  # resolve libseccomp now: a hardened worker cannot run find_library's helpers
    facades = build_facades()
    payloads = warm_up_payloads()
    warm_up(facades, payloads, WARM_UP)
    baseline = _vm_size()
    hard = dict(config["hardening"])
    hard["address_space"] = baseline + int(config["worker_memory"])
    hard["read_paths"] = tuple(library_paths())
    cfg = HardeningConfig(**hard)
    limits = config["limits"]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    gc.collect()
    gc.freeze()
    control.send(
        json.dumps(
            {"ready": True, "pid": os.getpid(), "baseline_vm": baseline, "address_space": cfg.address_space}
        ).encode()
    )
    while True:
        try:
            request = control.recv(65536)
        except OSError:
            break
        if not request:
            break
        message = json.loads(request)
        if message.get("op") != "spawn":
            continue
        slot = int(message["slot"])
        server_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            control.close()
            server_end.close()
            worker.serve(worker_end, slot, cfg, os.getppid(), facades, limits, payloads)
            os._exit(0)
        worker_end.close()
        socket.send_fds(control, [json.dumps({"pid": pid, "slot": slot}).encode()], [server_end.fileno()])
        server_end.close()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
