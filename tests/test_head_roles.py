"""head-roles: every head's detection scores match its planted role with a margin, induction rests on
K-composition, roles move with the seed, weight statistics do not predict roles, block 0 is an MLP-only decoder
without which no head keeps its role and whose linear part is zero (versions 3-4), whose units write dense mixtures
of features that sum exactly to each code's features (version 4), and the grader."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from baselines import head_stats
from helpers import cached_instance, sweep_truths
from mechsandbox.evaluation.redteam_head_roles import read_roles
from mechsandbox.evaluation.shortcuts import earlier_mlp_writes, low_rank_svdvals
from mechsandbox.tasks import LEVELS, get_family, grade
from mechsandbox.tasks.circuits import Planter
from mechsandbox.tasks.head_roles.generator import (
    FIRST,
    N_CTX,
    ROLES,
    block0,
    config,
    decoded,
    detect_roles,
    layout,
    role_scores,
)
from mechsandbox.tasks.rng import Stream

FAM = "head-roles"
N_SEEDS = 100
GRADED = (FIRST, FIRST + 1)


@pytest.mark.parametrize("level", LEVELS)
def test_detection_scores_match_the_planted_roles(level: str) -> None:
    for seed in range(6):
        inst = cached_instance(FAM, seed, level)
        roles, scores = detect_roles(inst.model, inst.probe["tokens"])
        for (layer, head), role in roles.items():
            assert inst.truth["roles"][f"L{layer}H{head}"] == role, (seed, layer, head, scores[(layer, head)])
            values = sorted(scores[(layer, head)].values())
            assert values[-2] <= 0.25 and (role == "none" or values[-1] >= 0.55)
        assert len(roles) == len(inst.truth["roles"]) == len(GRADED) * inst.model.cfg.n_heads
        per_layer = [Counter(r for h, r in inst.truth["roles"].items() if h.startswith(f"L{lay}")) for lay in GRADED]
        assert all(c.most_common(1)[0][1] >= 2 for c in per_layer), "a redundant pair in each layer"
        assert "induction" not in per_layer[0] and "induction" in per_layer[1]


def test_induction_heads_rest_on_a_block1_head() -> None:
    inst = cached_instance(FAM, 3, "medium")
    tokens, model = inst.probe["tokens"], inst.model
    induction = [int(h.split("H")[1]) for h, r in inst.truth["roles"].items() if r == "induction"]
    patterns: dict[int, torch.Tensor] = {}
    for head in range(model.cfg.n_heads):

        def zero(z, hook, head=head):
            z[:, :, head] = 0.0
            return z

        def keep(pattern, hook, head=head):
            patterns[head] = pattern

        hooks = [(f"blocks.{FIRST}.attn.hook_z", zero), (f"blocks.{FIRST + 1}.attn.hook_pattern", keep)]
        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=hooks)
    drops = [float(role_scores(patterns[h])["induction"][induction].mean()) for h in range(model.cfg.n_heads)]
    assert min(drops) < 0.2 < max(drops), "exactly the previous-token head that feeds the induction heads matters"
    assert sorted(drops)[1] > 0.5, "and no other block-1 head"


@pytest.mark.parametrize("level", LEVELS)
def test_roles_vary_and_constant_answers_score_low(level: str) -> None:
    truths = sweep_truths(FAM, level)  # seeds 0..99 (the first 40 generated, tests/sweep_truths.py)
    heads = sorted(truths[0]["roles"])
    mode = {h: Counter(t["roles"][h] for t in truths).most_common(1)[0][0] for h in heads}
    candidates = [mode] + [{h: role for h in heads} for role in ROLES]
    for lay in GRADED:  # one role for a block, the per-position mode for the other
        for role in ROLES:
            candidates.append({h: role if h.startswith(f"L{lay}") else mode[h] for h in heads})
    best = max(sum(grade(FAM, c, t).score for t in truths) / N_SEEDS for c in candidates)
    assert best <= 0.15, best
    assert len({tuple(sorted(t["roles"].items())) for t in truths}) == N_SEEDS


def _profiles(inst) -> dict[tuple[int, int], list[float]]:
    """Sorted singular values of each head's QK (W_Q W_K^T) and OV (W_V W_O), d_head of each."""
    m, out = inst.model, {}
    with torch.no_grad():
        for lay in GRADED:
            for h in range(m.cfg.n_heads):
                qk = low_rank_svdvals(m.W_Q[lay, h], m.W_K[lay, h])[: m.cfg.d_head]
                ov = low_rank_svdvals(m.W_V[lay, h], m.W_O[lay, h].T)[: m.cfg.d_head]
                out[(lay, h)] = [*qk.tolist(), *ov.tolist()]
    return out


def _neuron_profiles(inst) -> dict[tuple[int, int], list[float]]:
    """The same, of each head's circuits read in block 0's unit basis: W_out QK W_out^T and W_out OV."""
    m, out = inst.model, {}
    with torch.no_grad():
        for lay in GRADED:
            n = earlier_mlp_writes(m, lay)
            for h in range(m.cfg.n_heads):
                q, k, v, o = (t.double() for t in (m.W_Q[lay, h], m.W_K[lay, h], m.W_V[lay, h], m.W_O[lay, h]))
                qk = low_rank_svdvals(n @ q, n @ k)[: m.cfg.d_head]
                ov = low_rank_svdvals(n @ v, o.T)[: m.cfg.d_head]
                out[(lay, h)] = [*qk.tolist(), *ov.tolist()]
    return out


@pytest.mark.parametrize("level", LEVELS)
def test_every_head_of_a_layer_has_the_same_spectra(level: str) -> None:
    """The QK and OV singular values of every head of a layer are one profile (exactly, up to the
    weight grid, without noise; within the noise, relative to the largest, otherwise), whatever the role."""
    for seed in range(4):
        inst = cached_instance(FAM, seed, level)
        for profiles in (_profiles(inst), _neuron_profiles(inst)):  # and read in block 0's units (an isometry)
            for lay in GRADED:
                both = torch.tensor([profiles[(lay, h)] for h in range(inst.model.cfg.n_heads)])
                for p in both.split(inst.model.cfg.d_head, dim=1):  # QK, then OV
                    spread = float((p.max(0).values - p.min(0).values).max() / p.max())
                    assert spread <= SPREAD_TOL[level], (seed, lay, spread)


# the weight grid without noise; within the noise otherwise (version 6 over seeds 0-3: medium 0.088, hard 0.173, where
# the noise's own singular values, beyond OV's rank, spread most)
SPREAD_TOL = {"easy": 1e-4, "medium": 0.15, "hard": 0.25}


def _column_projectors(w: torch.Tensor) -> torch.Tensor:
    """[heads, d_model, d_model]: the projector onto each head's column space (its non-zero singular directions:
    OV uses V of its d_head dims)."""
    u, sv, _ = torch.linalg.svd(w, full_matrices=False)
    keep = (sv > 1e-3 * sv.amax(dim=-1, keepdim=True)).double()  # above the weight grid
    return (u * keep[:, None, :]) @ u.mT


def test_every_head_reads_its_key_positions_from_a_private_copy() -> None:
    """Version 7: every head of a block reads the same residual subspaces on the query and value sides whatever its
    role; on the key side, the token parts' subspaces (``prev``, ``tok``) are shared and the positional part's is the
    head's own: the key column spaces of any two graded heads of the model meet in exactly the shared 2 * vocab
    dims. Exact without noise (the weight grid: 3e-6)."""
    for seed in range(3):
        m = cached_instance(FAM, seed, "easy").model
        vocab = m.cfg.d_vocab
        keys = []
        for lay in GRADED:
            projs = [_column_projectors(w.detach().double()) for w in (m.W_Q[lay], m.W_V[lay])]
            for proj in projs:
                assert float((proj - proj[0]).abs().max()) <= 1e-4, (seed, lay)
            keys.append(_column_projectors(m.W_K[lay].detach().double()))
        keys = torch.cat(keys)
        for a in range(len(keys)):
            for b in range(a + 1, len(keys)):
                shared = torch.linalg.matrix_rank(keys[a] @ keys[b], atol=1e-3)  # the eigenvalue-1 part: overlap
                common = int((torch.linalg.eigvalsh(keys[a] @ keys[b] @ keys[a]) > 1 - 1e-4).sum())
                assert common == 2 * vocab and int(shared) == 2 * vocab, (seed, a, b, common, int(shared))


@pytest.mark.parametrize("level", LEVELS)
def test_no_two_heads_share_a_planted_entry(level: str) -> None:
    """Version 7 (version 6's red team: heads planted with the same rule shared entries in the one decoded basis, so
    the Frobenius inner products of their circuits named clusters of one role through any rotation): the QK circuits
    of any two graded heads of the model are orthogonal (exactly, up to the weight grid, without noise; within the
    noise otherwise), whatever their roles, and so are their positional parts' images under any product of two
    heads' circuits: QK_a QK_b^T is zero (the keys are private)."""
    for seed in range(3):
        m = cached_instance(FAM, seed, level).model
        qk = torch.stack([m.W_Q[lay, h].detach().double() @ m.W_K[lay, h].detach().double().T
                          for lay in GRADED for h in range(m.cfg.n_heads)])  # fmt: skip
        flat = qk.flatten(1)
        norm = flat.norm(dim=1)
        cos = (flat @ flat.T) / (norm[:, None] * norm[None, :])
        cos.fill_diagonal_(0.0)
        assert float(cos.abs().max()) <= OVERLAP_TOL[level], (seed, float(cos.abs().max()))


OVERLAP_TOL = {"easy": 1e-6, "medium": 0.02, "hard": 0.05}


def test_decoded_sums_are_one_value_for_every_head() -> None:
    """Version 7 (a red team on version 6: the sum of block 0's firing writes is the sum of every code's decoded
    features, and a head's QK read on it summed its pairs' signs, which named duplicate-token and attend-to-first
    heads at 0.45-0.50): for the sums of what block 0 decodes from all positions and from all tokens, and for what
    the copying head makes of them, every bilinear form x^T QK y is one value for every head of a block, relative
    to the block's strength. Each code alone fires only its own kind's units, so block 0's output on it is exactly
    that code's decoded features. At easy, without noise (the weight grid: 1.2e-4 measured, on sums of a thousand):
    with noise, a form on these long sums carries noise of the order of its own spread (0.26 medium, 0.51 hard)."""
    for seed in range(3):
        m = cached_instance(FAM, seed, "easy").model
        with torch.no_grad():
            mlp = m.blocks[0].mlp
            pos = mlp(m.W_pos.detach()).double().sum(0)
            tok = mlp(m.W_E.detach()).double().sum(0)
            sums = {"pos": pos, "tok": tok}
            # what every block-1 head writes from the token sum (the copying head's is the ``prev`` sum)
            ov = torch.einsum("d,hde,hef->hf", tok, m.W_V[FIRST].double(), m.W_O[FIRST].double())
            for lay in GRADED:
                values = []
                for h in range(m.cfg.n_heads):
                    qk = m.W_Q[lay, h].double() @ m.W_K[lay, h].double().T
                    forms = [sums[a] @ qk @ sums[b] for a in sums for b in sums]
                    forms += [tok @ qk @ ov[g] for g in range(m.cfg.n_heads)] if lay > FIRST else []
                    values.append(torch.stack(forms))
                values = torch.stack(values)
                scale = values.abs().max()
                spread = float((values.max(0).values - values.min(0).values).max() / scale)
                assert spread <= 1e-3, (seed, lay, spread, values[:, :4].tolist())


@pytest.mark.parametrize("level", LEVELS)
def test_weight_statistics_do_not_predict_roles(level: str) -> None:
    """A nearest-centroid classifier on per-head weight statistics (norms, ranks of QK/OV) and the
    sorted singular-value profiles of QK and OV, with the layer, fitted on 20 seeds and tested on 20
    others, scores <= 0.3 chance-corrected."""

    def rows(seed: int) -> list[tuple[list[float], str]]:
        inst = cached_instance(FAM, seed, level)
        stats, profiles = head_stats(inst), _profiles(inst)
        truth = inst.truth["roles"]
        return [([h[0], *stats[h].values(), *profiles[h]], truth[f"L{h[0]}H{h[1]}"]) for h in sorted(profiles)]

    train = [r for seed in range(20) for r in rows(seed)]
    x = torch.tensor([v for v, _ in train])
    mean, std = x.mean(0), x.std(0) + 1e-9
    centroids = {
        role: ((x[[i for i, (_, r) in enumerate(train) if r == role]] - mean) / std).mean(0)
        for role in ROLES
        if any(r == role for _, r in train)
    }
    scores = []
    for seed in range(20, 40):
        inst = cached_instance(FAM, seed, level)
        answer = {}
        for (values, _), head in zip(rows(seed), sorted(_profiles(inst)), strict=True):
            z = (torch.tensor(values) - mean) / std
            answer[f"L{head[0]}H{head[1]}"] = min(centroids, key=lambda r: float((z - centroids[r]).norm()))
        scores.append(grade(FAM, answer, inst.truth).score)
    assert sum(scores) / len(scores) <= 0.3, scores


def test_roles_grader() -> None:
    truth = cached_instance(FAM, 0, "easy").truth
    assert grade(FAM, truth["roles"], truth).score == 0.99
    half = dict(list(truth["roles"].items())[: len(truth["roles"]) // 2])
    partial = grade(FAM, half, truth).score
    assert 0.3 < partial < 0.6
    wrong = {h: "none" if r != "none" else "local" for h, r in truth["roles"].items()}
    assert grade(FAM, wrong, truth).score == 0.01
    for bad in ([[0, 1]], {"L0H0": "copy"}, {"L9H0": "none"}, {"X": "none"}, "none", 3, {"L0H0": 1}):
        result = grade(FAM, bad, truth)
        assert result.rejected and result.message, bad
    assert not grade(FAM, get_family(FAM).answer_example, truth).rejected
    # block 0's heads (attention switched off) may be labelled "none", and are not graded; no other role
    block0 = {f"L0H{h}": "none" for h in range(truth["n_heads"])}
    assert grade(FAM, {**truth["roles"], **block0}, truth).score == 0.99
    result = grade(FAM, {**truth["roles"], "L0H0": "previous-token"}, truth)
    assert result.rejected and "switched off" in result.message


def test_block0_is_an_mlp_decoder_the_roles_need() -> None:
    """Block 0's attention and the later blocks' MLPs are exactly zero; without block 0's MLP output no head keeps
    its role (the heads read only what it decodes)."""
    for level in LEVELS:
        inst = cached_instance(FAM, 0, level)
        m = inst.model
        assert all(float(p.detach().abs().max()) == 0.0 for p in m.blocks[0].attn.parameters())
        assert all(float(p.detach().abs().max()) == 0.0 for b in m.blocks[FIRST:] for p in b.mlp.parameters())
        with m.hooks(fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: torch.zeros_like(x))]):
            roles, _ = detect_roles(m, inst.probe["tokens"])
        kept = sum(r == inst.truth["roles"][f"L{lay}H{h}"] for (lay, h), r in roles.items() if r != "none")
        assert kept <= 1, (level, kept)


@pytest.mark.parametrize("level", LEVELS)
def test_no_linear_reading_of_the_embeddings(level: str) -> None:
    """The heads read nothing of the raw embeddings (W_E QK W_E^T, W_pos QK W_pos^T and the cross terms, against
    the same head's circuit read in block 0's units), block 0's MLP has no linear part (its ReLU dropped, it maps
    the embeddings to nothing: W_E W_in W_out, W_pos W_in W_out; a firing unit writes 1 into its feature), and
    every head's QK has trace zero (no role's bilinear form has a sign that a random projection of the weights,
    such as the embeddings' noise, would show). Exact up to the weight grid without noise, within it otherwise."""
    tol = RAW_TOL[level]
    for seed in range(3):
        inst = cached_instance(FAM, seed, level)
        m = inst.model
        raw = [m.W_E.detach().double(), m.W_pos.detach().double()]
        mlp_in, mlp_out = (m.blocks[0].mlp.W_in.detach().double(), m.blocks[0].mlp.W_out.detach().double())
        for e in raw:  # with noise, W_in's noise times W_out swamps the test (6.2 at hard), so it runs at easy
            assert level != "easy" or float((e @ mlp_in @ mlp_out).norm(dim=1).max()) <= 1e-6, seed
        for lay in GRADED:
            for h in range(m.cfg.n_heads):
                qk = m.W_Q[lay, h].detach().double() @ m.W_K[lay, h].detach().double().T
                decoded = float((mlp_out @ qk @ mlp_out.T).abs().max())
                worst = max(float((a @ qk @ b.T).abs().max()) for a in raw for b in raw)
                assert worst <= tol["qk"] * decoded, (seed, lay, h, worst / decoded)
                assert abs(float(torch.trace(qk))) <= tol["trace"] * float(qk.norm()), (seed, lay, h)


RAW_TOL = {  # 2-3x the maxima measured over seeds 0-2 (easy qk: the weight grid, measured 7e-10); in version 2 the raw
    # readings were the heads' circuits themselves
    "easy": {"qk": 1e-6, "trace": 2e-4},
    "medium": {"qk": 0.01, "trace": 0.01},
    "hard": {"qk": 0.03, "trace": 0.02},
}


@pytest.mark.parametrize("level", LEVELS)
def test_block0_decodes_exactly_through_dense_unit_writes(level: str) -> None:
    """Version 4's decoder, planted alone (unrotated, noise-free): on every (position, token) the MLP writes exactly
    the features the heads read (the position's ``pos`` and its slot in every head's key copy, the token's
    ``tok``/``tok2``/``tok3``, the constant 1, nothing else); its write map is an isometry on the decoded features;
    its linear part is zero; and no unit writes one feature: every write is a dense mixture (version 3's units each
    wrote one, which made the entries of W_out QK W_out^T the planted circuit)."""
    cfg = config(level)
    graded = len(GRADED) * cfg.n_heads
    lay = layout(cfg.d_vocab, graded)
    for seed in range(2):
        p = Planter(cfg, lay)
        s = Stream(seed, f"test/{level}")
        slots = [s.permutation(N_CTX + 1) for _ in range(graded)]
        block0(p, s, slots)
        w_in, b_in, w_out = p.W_in[0], p.b_in[0], p.W_out[0]
        assert p.mlp_used[0] == cfg.d_mlp
        for i in range(N_CTX):
            x = p.W_E + p.W_pos[i]  # every token at position i
            out = np.maximum(x @ w_in + b_in, 0.0) @ w_out
            want = np.zeros_like(out)
            keys = [lay.idx(f"key{g}", sl[i]) for g, sl in enumerate(slots)]
            want[:, [lay.idx("pos", i), *keys, lay.idx("const")]] = 1.0
            for t in range(cfg.d_vocab):
                want[t, [lay.idx("tok", t), lay.idx("tok2", t), lay.idx("tok3", t)]] = 1.0
            assert np.abs(out - want).max() <= 1e-9, (seed, i)
        feats = decoded(lay)
        gram = w_out.T @ w_out
        gamma = gram[feats[0], feats[0]]
        assert np.abs(gram[np.ix_(feats, feats)] - gamma * np.eye(len(feats))).max() <= 1e-9 * gamma
        assert np.abs(np.delete(gram, feats, axis=0)).max() == 0.0, "nothing outside the decoded features"
        assert np.abs(w_in @ w_out).max() <= 1e-12, "the ReLU dropped, the MLP writes nothing"
        share = (w_out**2).max(axis=1) / (w_out**2).sum(axis=1)  # the largest feature's share of each write
        spread = (w_out**2).sum(axis=1) ** 2 / (w_out**4).sum(axis=1)  # participation ratio: features written
        assert share.max() <= 0.2 and spread.min() >= len(feats) / 8, (seed, share.max(), spread.min())


def test_weights_circuit_reading_names_roles() -> None:
    """The weight-space reading the family accepts as interpretability (evaluation/redteam_head_roles.py: block 0
    decoded from W_out, every head's QK read as a shift in the decoded basis; docs/TASKS.md says why) names every
    role. If a version makes it fail, docs/TASKS.md's technique table and findings must say what replaced it."""
    scores = []
    for level in LEVELS:
        for seed in range(2):
            inst = cached_instance(FAM, seed, level)
            scores.append(grade(FAM, read_roles(inst.model), inst.truth).score)
    assert min(scores) >= 0.95, scores
