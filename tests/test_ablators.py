"""The generators' ablation shortcuts agree with the plain definition of an ablation.

Why: acceptance checks decide which candidate model becomes an instance, and they run through two shortcuts
(``tasks/circuits.py``): :meth:`Ablator.run_from` (bit-identical to a whole hooked forward pass, which keeps
fact-storage's bytes) and :class:`QueryAblator` (the same arithmetic in another order: equal up to rounding, and
the families tighten every bound by ``FAST_GUARD``). If either drifted, instances would silently stop meeting the
contract the property tests read with the exact path, or the guard band would no longer cover the difference.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from mechsandbox.tasks.circuits import FAST_GUARD, Ablator, QueryAblator, ablate_heads
from mechsandbox.tasks.fact_storage.generator import replace_subjects, windows
from mechsandbox.tasks.induction_circuit.generator import HALF, N_CTX
from mechsandbox.tasks.rng import Stream

from tests.helpers import cached_instance

CASES = [  # family, level, seed, the query positions its acceptance check reads
    ("committee-circuit", "hard", 0, slice(-1, None)),
    ("committee-circuit", "easy", 1, slice(-1, None)),
    ("induction-circuit", "hard", 0, slice(HALF, N_CTX - 1)),
    ("copy-head", "medium", 2, slice(None)),
]


def _head_sets(n_layers: int, n_heads: int) -> list[list[tuple[int, int]]]:
    """Every head alone, and pairs and triples across and within layers (what the committee checks ablate)."""
    heads = [(lay, h) for lay in range(n_layers) for h in range(n_heads)]
    gen = torch.Generator().manual_seed(0)
    picks = [torch.randperm(len(heads), generator=gen)[:k].tolist() for k in (2, 2, 3, 3, 4)]
    return [[hd] for hd in heads] + [[heads[i] for i in pick] for pick in picks] + [heads[:2], heads[-2:]]


@pytest.mark.parametrize(("task_id", "level", "seed", "queries"), CASES)
def test_query_ablator_matches_zeroed_heads(task_id: str, level: str, seed: int, queries: slice) -> None:
    inst = cached_instance(task_id, seed, level)
    model, tokens = inst.model, inst.probe["tokens"]
    fast = QueryAblator(model, tokens, queries)
    worst = 0.0
    for heads in [[], *_head_sets(model.cfg.n_layers, model.cfg.n_heads)]:
        exact = ablate_heads(model, tokens, heads)[:, queries]
        got = fast.logits(heads)
        assert got.shape == exact.shape
        worst = max(worst, float((got - exact).abs().max()))
    # a logit is about 10 here: float32 rounding, far inside the guard band of a margin averaged over the batch
    assert worst < FAST_GUARD, worst


def test_query_ablator_reads_the_current_unembedding() -> None:
    """committee-circuit shifts b_U after building the ablator: logits must follow it."""
    inst = cached_instance("committee-circuit", 0, "medium")
    model = inst.model
    fast = QueryAblator(model, inst.probe["tokens"], slice(-1, None))
    before = fast.logits([(1, 0)]).clone()
    saved = model.unembed.b_U.detach().clone()
    try:
        with torch.no_grad():
            model.unembed.b_U[3] += 1.5
        diff = fast.logits([(1, 0)]) - before
    finally:
        with torch.no_grad():
            model.unembed.b_U.copy_(saved)
    assert torch.allclose(diff[..., 3], torch.full_like(diff[..., 3], 1.5))
    assert diff[..., :3].abs().max() == 0 and diff[..., 4:].abs().max() == 0


def test_query_ablator_refuses_models_with_mlps() -> None:
    inst = cached_instance("fact-storage", 0, "easy")
    with pytest.raises(ValueError, match="attention-only"):
        QueryAblator(inst.model, inst.probe["tokens"])


@pytest.mark.parametrize("site", ["mlp_out", "attn_out", "resid_pre"])
def test_run_from_is_bit_identical_to_a_hooked_forward(site: str) -> None:
    """What fact-storage's causal trace relies on to keep its version's bytes: restoring one layer's clean
    activation from the corrupted stream entering that layer equals the whole hooked forward pass bit for bit."""
    inst = cached_instance("fact-storage", 3, "medium")
    model, clean = inst.model, inst.probe["tokens"]
    start = int(torch.nonzero(clean[0] < 16)[0])  # the subject span: the first subject token
    length = int((clean[0] < 16).sum())
    pairs = {p for row in clean.tolist() for p in windows(tuple(t for t in row if t < 16))}
    corrupt = replace_subjects(Stream(0, "test"), clean, start, length, pairs)
    run = Ablator(model, corrupt)
    for layer, pos in itertools.product(range(model.cfg.n_layers), (start, clean.shape[1] - 1)):
        name = f"blocks.{layer}.hook_{site}"
        with torch.no_grad():
            _, cache = model.run_with_cache(clean, names_filter=lambda n, name=name: n == name)

        def restore(act, hook, name=name, pos=pos):
            act[:, pos] = cache[name][:, pos]
            return act

        with torch.no_grad():
            whole = model.run_with_hooks(corrupt, fwd_hooks=[(name, restore)])
        assert torch.equal(run.run_from(layer, [(name, restore)]), whole), (layer, pos)
    with torch.no_grad():  # run_from removed its hooks: a plain forward is the corrupted run again
        assert torch.equal(model(corrupt), run.clean)
