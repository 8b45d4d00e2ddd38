"""The few lines every task prompt ends with: what a snippet's namespace offers, so that an agent that has
never seen MechSandbox writes working code on its first step (issue 17). Appended by the server at reset
(server/episode.py), not stored in instances, so artifacts and their hashes do not depend on it."""

from __future__ import annotations

from torch import nn

from .hooked import HookedTransformer

COMMON = """\
The sandbox is a notebook: names persist between snippets; print results (a bare expression on the last line is
shown too). Importable: torch (nn, F, fft, linalg, optim, autograd), numpy, einops, math, itertools, collections,
functools, statistics, heapq, json, random, re, copy. `reset_model()` undoes weight edits and hooks and keeps your
other names. Weights load with requires_grad=False: `model.requires_grad_(True)` turns gradients on."""

TRANSFORMER = """\
`model` follows TransformerLens: `model(tokens)`, `model.run_with_cache(tokens)` and `cache["pattern", layer]`,
`model.run_with_hooks(tokens, fwd_hooks=[(name, fn)])` or `with model.hooks(fwd_hooks=...):`, hook names from
`utils.get_act_name` (also `from transformer_lens import utils`), weights `model.W_Q` [layer, head, d_model, d_head]
etc., factored circuits `model.OV` / `model.QK` (`.AB`, `.svd()`, `.eigenvalues`, `[layer, head]`), cache helpers
`decompose_resid`, `stack_head_results`, `logit_attrs`, strings `model.to_str_tokens(tokens)` (token i is "t{i}")."""


def namespace_guide(model: nn.Module) -> str:
    """The guide for a session whose model is ``model``."""
    return COMMON + ("\n" + TRANSFORMER if isinstance(model, HookedTransformer) else "")
