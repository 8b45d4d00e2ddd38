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
from mechsandbox.tasks.circuits import FAST_GUARD, Ablator, QueryAblator, ablate_heads, margin
from mechsandbox.tasks.committee_circuit import generator as committee
from mechsandbox.tasks.fact_storage.generator import replace_subjects, windows
from mechsandbox.tasks.induction_circuit.generator import HALF, N_CTX
from mechsandbox.tasks.rng import Stream

from tests.helpers import cached_instance

CASES = [  # family, level, seed, query positions (what the acceptance check reads; copy-head: all, the stricter case)
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
    """Logits agree to float32 rounding (logits of 20-30 here), and the mean margins the checks compare (in logits:
    induction's and copy-head's bounds are in logits) agree to a quarter of the guard band, for every head alone
    and for sets of heads across and within layers."""
    inst = cached_instance(task_id, seed, level)
    model, tokens = inst.model, inst.probe["tokens"]
    targets = inst.probe["targets"][:, None] if "targets" in inst.probe else tokens[:, 1:][:, queries]
    fast = QueryAblator(model, tokens, queries)
    worst_logit = worst_margin = 0.0
    for heads in [[], *_head_sets(model.cfg.n_layers, model.cfg.n_heads)]:
        exact = ablate_heads(model, tokens, heads)[:, queries]
        got = fast.logits(heads)
        assert got.shape == exact.shape
        worst_logit = max(worst_logit, float((got - exact).abs().max()))
        if task_id != "copy-head":  # copy-head's margin is read at the last position alone
            m_exact, m_fast = (float(margin(lg, targets).mean()) for lg in (exact, got))
            worst_margin = max(worst_margin, abs(m_exact - m_fast))
    assert worst_logit < 2e-4, worst_logit
    assert worst_margin < FAST_GUARD / 4, worst_margin  # a drop is two margins apart: half the guard at most


@pytest.mark.parametrize("level", ["easy", "hard"])
def test_committee_fast_effects_match_the_exact_ones(level: str) -> None:
    """What the committee checks compare: drops as fractions of the clean margin, fast against exact, for every
    head alone, every pair and the whole committee, and the sums the takeover and additivity checks form."""
    inst = cached_instance("committee-circuit", 2, level)
    model, tokens, targets = inst.model, inst.probe["tokens"], inst.probe["targets"]
    pairs = [(tuple(p), tuple(b)) for p, b in inst.truth["pairs"]]
    exact, fast = (committee._Effects(model, tokens, targets, fast=f) for f in (False, True))
    sets = [[(lay, h)] for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    sets += [list(pair) for pair in pairs] + [[h for pair in pairs for h in pair]]
    gaps = [abs(exact.drop(hs) - fast.drop(hs)) for hs in sets]
    assert abs(exact.clean - fast.clean) < FAST_GUARD / 10
    assert max(gaps) < FAST_GUARD / 20, max(gaps)  # a check combines up to 4 drops: a fifth of the guard at most


def test_query_ablator_refuses_models_with_mlps() -> None:
    inst = cached_instance("fact-storage", 0, "easy")
    with pytest.raises(ValueError, match="attention-only"):
        QueryAblator(inst.model, inst.probe["tokens"])


def test_query_ablator_refuses_heads_it_does_not_have() -> None:
    inst = cached_instance("copy-head", 0, "easy")
    fast = QueryAblator(inst.model, inst.probe["tokens"], slice(-1, None))
    for heads in ([(0, -1), (0, 11)], [(-1, 0)], [(2, 0)], [(1, 12)]):
        with pytest.raises(ValueError, match="no head"):
            fast.logits(heads)


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

        def restore(act, hook, name=name, pos=pos, cache=cache):
            act[:, pos] = cache[name][:, pos]
            return act

        with torch.no_grad():
            whole = model.run_with_hooks(corrupt, fwd_hooks=[(name, restore)])
        assert torch.equal(run.run_from(layer, [(name, restore)]), whole), (layer, pos)
    with pytest.raises(ValueError, match="not in block 2 or later"):
        run.run_from(2, [("blocks.1.hook_mlp_out", lambda act, hook: act)])
    with torch.no_grad():  # run_from removed its hooks: a plain forward is the corrupted run again
        assert torch.equal(model(corrupt), run.clean)
