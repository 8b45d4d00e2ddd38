"""The planted mechanism is really there, on each family's own probe inputs, over many seeds."""

from __future__ import annotations

import pytest
import torch
from helpers import cached_instance
from mechsandbox.evaluation.shortcuts import composition_scores, low_rank_svdvals, same_token_composition
from mechsandbox.tasks import LEVELS
from mechsandbox.tasks.bilinear import fit_r2
from mechsandbox.tasks.circuits import ablate_heads, single_head_ablations
from mechsandbox.tasks.committee_circuit.generator import GROUPS, build_committees, committee_effects, satisfies_spec
from mechsandbox.tasks.fourier_frequencies.generator import freq_power
from mechsandbox.tasks.induction_circuit.generator import HALF, MIN_MARGIN, READERS, WRITERS, induction_margin

SEEDS = range(12)


@pytest.mark.parametrize("level", LEVELS)
def test_dead_neurons(level: str) -> None:
    for seed in SEEDS:
        inst = cached_instance("dead-neurons", seed, level)
        model, x, dead = inst.model, inst.probe["X"], inst.truth["indices"]
        w, b = model[0].weight.detach(), model[0].bias.detach()
        if level == "hard":
            lo, hi = inst.probe["box"]
            bound = b + torch.maximum(w * lo, w * hi).sum(dim=1)
            xs = lo + (hi - lo) * torch.rand(50_000, w.shape[1], generator=torch.Generator().manual_seed(seed))
            fires = ((xs @ w.T + b) > 0).double().mean(dim=0)
            assert all(bound[j] < 0 and fires[j] == 0 for j in dead)
            live = [j for j in range(w.shape[0]) if j not in dead]
            assert all(fires[j] >= 0.008 for j in live)
            assert sum(1 for j in live if fires[j] <= 0.07) >= 4, "rarely firing distractors exist"
        else:
            with torch.no_grad():
                base = model(x)
                for i in range(x.shape[1]):
                    moved = x.clone()
                    moved[:, i] = -moved[:, i]
                    changed = (model(moved) - base).abs().max().item()
                    assert (changed == 0.0) == (i in dead), (seed, i, changed)
            col = w.norm(dim=0)
            tiny = [i for i in range(w.shape[1]) if i not in dead and col[i] < 0.1 * col.median()]
            assert (len(tiny) >= 2) == (level == "medium"), "medium has tiny-but-live distractors"


@pytest.mark.parametrize("task_id", ["multiplication-neuron", "additive-bypass"])
@pytest.mark.parametrize("level", LEVELS)
def test_gated_unit_computes_the_stated_function(task_id: str, level: str) -> None:
    for seed in SEEDS:
        inst = cached_instance(task_id, seed, level)
        x, target, (j,) = inst.probe["X"], inst.probe["target"], inst.truth["indices"]
        with torch.no_grad():
            h = (inst.model.left(x) * inst.model.right(x)).double().numpy()
        xs = x.double().numpy()
        feature = xs[:, target[0]] * xs[:, target[1]] if task_id == "multiplication-neuron" else xs[:, target]
        r2 = fit_r2(h, feature)
        assert r2[j] >= 0.94, (seed, r2[j])
        others = sorted(r2[k] for k in range(len(r2)) if k != j)
        assert others[-1] <= 0.91, "no distractor computes the stated function"
        assert others[-1] >= 0.3, "a confusable distractor shares part of the function"
        with torch.no_grad():  # the unit matters for the output
            ablated = inst.model.out(inst.model.left(x) * inst.model.right(x) * (torch.arange(h.shape[1]) != j))
            assert (ablated - inst.model(x)).abs().mean() > 1e-3


@pytest.mark.parametrize("level", LEVELS)
def test_fourier_key_frequencies(level: str) -> None:
    for seed in SEEDS:
        inst = cached_instance("fourier-frequencies", seed, level)
        power = freq_power(inst.model.embed.weight.detach().double().numpy())
        power = power / power.max()
        keys = inst.truth["frequencies"]
        assert all(power[k - 1] >= 0.5 for k in keys)
        rest = sorted(power[k - 1] for k in range(1, len(power) + 1) if k not in keys)
        assert rest[-1] <= 0.2
        assert rest[-1] >= 0.05, "weaker distractor frequencies are present"


@pytest.mark.parametrize("level", LEVELS)
def test_copy_head(level: str) -> None:
    for seed in SEEDS:
        inst = cached_instance("copy-head", seed, level)
        model, tokens, targets = inst.model, inst.probe["tokens"], inst.probe["targets"]
        ((lay, head),) = inst.truth["heads"]
        from mechsandbox.tasks.circuits import margin

        with torch.no_grad():
            clean = margin(model(tokens)[:, -1], targets).mean().item()
            _, cache = model.run_with_cache(tokens)
        assert 2.0 <= clean <= 15.0, "margins at realistic scales, not saturated"
        drop = clean - margin(ablate_heads(model, tokens, [(lay, head)])[:, -1], targets).mean().item()
        assert drop >= 0.6 * clean
        pos = (tokens == targets[:, None]).float()
        attn = (cache["pattern", lay][:, head, -1] * pos).sum(dim=1).mean().item()
        assert attn >= 0.8, "the copy head attends to the marked token"
        others = [
            clean - margin(ablate_heads(model, tokens, [(ly, h)])[:, -1], targets).mean().item()
            for ly in range(2)
            for h in range(model.cfg.n_heads)
            if (ly, h) != (lay, head)
        ]
        assert max(abs(o) for o in others) <= 0.2 * drop
        assert max(abs(o) for o in others) > 0.0, "other heads are not dead weight"
        # decoy writers (version 2 on). Neither the QK circuit nor the OV circuit alone names the copy head: in each
        # layer >= 6 other heads attend to the marked token as strongly from some position, and >= 6 copy the marked
        # tokens into the output space as strongly, so ||W_E W_OV W_U|| is shared by >= 8 heads. Version 5: >= 5 of
        # them do both (blind writers), but not from the last position, where the logits are read.
        we, wu, marked = model.W_E.detach(), model.W_U.detach(), inst.probe["marked"]
        with torch.no_grad():
            full = torch.stack([torch.stack([we @ model.W_V[ly, h] @ model.W_O[ly, h] @ wu
                                             for h in range(model.cfg.n_heads)]) for ly in range(2)])  # fmt: skip
        copies = full[..., marked, marked].mean(-1)  # [layer, head]: logit gain of a marked token from itself
        fro = full.flatten(-2).norm(dim=-1)
        where = pos.argmax(dim=1)  # the marked token's position in each sequence
        for ly in range(2):
            at_mark = (cache["pattern", ly] * pos[:, None, None]).sum(-1)  # [batch, head, query]
            later = torch.arange(tokens.shape[1])[None, :] > where[:, None]  # [batch, query]: after the marked token
            per_query = (at_mark * later[:, None]).sum(0) / later.sum(0).clamp_min(1)  # [head, query]
            reads, last = per_query.max(dim=-1).values, per_query[:, -1]
            mine = [h for h in range(model.cfg.n_heads) if (ly, h) != (lay, head)]
            strong = {h for h in mine if reads[h] >= min(0.8, attn - 0.05)}
            writes = {h for h in mine if copies[ly, h] >= 0.6 * copies[lay, head]}
            assert len(strong) >= 6, "decoys that read the marked token"
            assert len(writes) >= 6, "decoys that copy it"
            assert sum(fro[ly, h] >= 0.5 * fro[lay, head] for h in mine) >= 8, "writers into the output space"
            blind = strong & writes
            assert len(blind) >= 5 and all(last[h] <= 0.2 for h in blind), "blind writers: not at the last position"


@pytest.mark.parametrize("level", LEVELS)
def test_induction_circuit(level: str) -> None:
    norm_ratios = []
    for seed in SEEDS:
        inst = cached_instance("induction-circuit", seed, level)
        model, tokens = inst.model, inst.probe["tokens"]
        roles = {v: k for k, v in inst.truth["roles"].items()}
        prev = (0, int(roles["previous-token"].split("H")[1]))
        ind = (1, int(roles["induction"].split("H")[1]))
        clean = induction_margin(model, tokens)
        assert MIN_MARGIN[level] <= clean <= 15.0
        after = single_head_ablations(model, tokens, lambda lg, m=model, t=tokens: induction_margin(m, t, lg))
        drops = {h: clean - v for h, v in after.items()}
        low = min(drops[prev], drops[ind])
        assert low >= 0.5 * clean
        assert all(abs(d) <= 0.25 * low for h, d in drops.items() if h not in (prev, ind)), (seed, drops)
        norm_ratios.append(_decoys_of_version_5(model, prev, ind))
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens)
        n = tokens.shape[1]
        p0 = cache["pattern", 0][:, prev[1]]
        assert torch.stack([p0[:, i, i - 1] for i in range(1, n)]).mean() >= 0.8
        p1 = cache["pattern", 1][:, ind[1]]
        induction_attn = torch.stack([p1[:, i, i - HALF + 1] for i in range(HALF, n)]).mean()
        assert induction_attn >= 0.6
        # K-composition: without the previous-token head, the induction head loses its target
        store = {}

        def zero_prev(z, hook, h=prev[1]):
            z[:, :, h] = 0.0
            return z

        def grab(pattern, hook, h=ind[1], store=store):
            store["p"] = pattern[:, h].detach()

        with torch.no_grad():
            model.run_with_hooks(
                tokens, fwd_hooks=[("blocks.0.attn.hook_z", zero_prev), ("blocks.1.attn.hook_pattern", grab)]
            )
        knocked = torch.stack([store["p"][:, i, i - HALF + 1] for i in range(HALF, n)]).mean()
        assert knocked <= 0.5 * induction_attn
        # every head of a layer has one QK and one OV singular-value profile (version 3): the spectra say
        # nothing about which head is the circuit's (exact up to the weight grid without noise)
        for lay in range(2):
            for circuit in ((model.W_Q, model.W_K), (model.W_V, model.W_O.transpose(-1, -2))):
                prof = low_rank_svdvals(*(w[lay].detach() for w in circuit))[:, : model.cfg.d_head]
                spread = float((prof.max(0).values - prof.min(0).values).max() / prof.max())
                assert spread <= (1e-4 if level == "easy" else 0.15), (seed, lay, spread)
    assert 0.85 <= sum(norm_ratios) / len(norm_ratios) <= 1.15, norm_ratios


def _decoys_of_version_5(model, prev: tuple[int, int], ind: tuple[int, int]) -> float:
    """Version 5's decoys are there in the weights: WRITERS echo heads write into what the unembedding reads
    as strongly as the induction head (W_E W_V W_O W_U, one gain); every layer-0 head's write is read, token by
    token, by exactly READERS layer-1 keys and every layer-1 key reads exactly READERS writes (a matching). Returns
    the mean composition norm of the reads by the heads that write into ``out`` (induction and echoes) over that of
    the scratch readers' reads: the caller checks, over seeds, that it is near 1 (a wiring with readers of one
    write and readers of several showed the difference, 1.35)."""
    with torch.no_grad():
        w_e, w_u = model.W_E.double(), model.W_U.double()
        ov = model.W_V[1].double() @ model.W_O[1].double()
        fro = (w_e @ ov @ w_u).norm(dim=(-2, -1))
        writers = fro >= 0.9 * fro[ind[1]]  # the induction head and its echoes
        assert int(writers.sum()) == 1 + WRITERS, fro
        weights = [w.double() for w in (model.W_Q, model.W_K, model.W_V, model.W_O)]
        aligned = same_token_composition(w_e, *weights)["ktok"][0, :, 1, :]
        reads = aligned >= 0.5 * float(aligned[prev[1], ind[1]])
        assert bool((reads.sum(dim=1) == READERS).all()) and bool((reads.sum(dim=0) == READERS).all()), reads
        norms = composition_scores(*weights)["k"][0, :, 1, :]
        return float(norms[:, writers][reads[:, writers]].mean() / norms[:, ~writers][reads[:, ~writers]].mean())


@pytest.mark.parametrize("level", LEVELS)
def test_committee_properties(level: str) -> None:
    """docs/CONTRACT.md, "The families", 7, as docs/TASKS.md reads it (version 2): pair >= 50%, primary alone
    10-40%, a visible backup alone 10-40% and a hidden one (medium: one of two, hard: all) inside the
    non-members' range, whole >= 90%, non-members (alone or paired with a member) <= 5% beyond the member
    alone, unequal pair effects that add up to the whole within 20%."""
    hidden_count = {"easy": 0, "medium": 1, "hard": 3}[level]
    for seed in range(6):
        inst = cached_instance("committee-circuit", seed, level)
        model, tokens, targets = inst.model, inst.probe["tokens"], inst.probe["targets"]
        pairs = [(tuple(p), tuple(b)) for p, b in inst.truth["pairs"]]
        eff = committee_effects(model, tokens, targets, pairs)
        assert min(eff["pair"]) >= 0.5
        assert all(0.1 <= d <= 0.4 for d in eff["primary"])
        visible = [d for d in eff["backup"] if d >= 0.1]
        assert len(visible) == len(pairs) - hidden_count and all(d <= 0.4 for d in visible)
        assert eff["whole"] >= 0.9
        assert abs(sum(eff["pair"]) - eff["whole"]) <= 0.2 * eff["whole"]
        assert max(eff["pair"]) - min(eff["pair"]) >= 0.1, "members' effects are unequal"
        members = [h for pair in pairs for h in pair]
        nonmembers = [
            (ly, h) for ly in range(model.cfg.n_layers) for h in range(model.cfg.n_heads) if (ly, h) not in members
        ]
        member_alone = {m: eff["drop"]([m]) for m in members}
        nm_alone = [eff["drop"]([nm]) for nm in nonmembers]
        assert max(abs(d) for d in nm_alone) <= 0.05
        for d in eff["backup"]:
            if d < 0.1:  # hidden: a single-ablation sweep cannot tell it from the non-members
                assert min(nm_alone) <= d <= max(nm_alone), (d, min(nm_alone), max(nm_alone))
        for nm in nonmembers[::3]:
            for m in members:
                assert abs(eff["drop"]([m, nm]) - member_alone[m]) <= 0.05
        # the backup reads its primary's output: it takes over only when the primary is gone
        for (p, b), pair_drop, p_drop, b_drop in zip(pairs, eff["pair"], eff["primary"], eff["backup"], strict=True):
            assert pair_drop - p_drop - b_drop >= 0.1, (p, b)


@pytest.mark.parametrize("level", LEVELS)
def test_committee_shadows_work_on_their_own_marks(level: str) -> None:
    """Version 4: the model holds GROUPS committees built by the same code and the probe marks one. Each shadow
    meets the contract's committee-level bounds on a probe of its own marks (clean margin >= 2, each pair >= 50%,
    all members >= 90%, primaries alone 10-40%), while test_committee_properties holds each shadow head, a
    non-member on the real probe, to <= 5%: which committee is the answer is a matter of the data. Version 5: each
    shadow also passes every acceptance check on its own probe, the hidden backups' range check included (version 4
    passed 4 of these 8 at hard), so running the checks on every committee's probe rules none of these out
    (docs/TASKS.md, item 7: 39 of 40 hard shadows over seeds 0-9)."""
    for seed in range(2):
        model, groups, real, _ = build_committees(seed, level)
        assert len(groups) == GROUPS and sum(g is real for g in groups) == 1
        assert len({tuple(g.marked) for g in groups}) == GROUPS  # each group its own mark tokens
        # the data makes the shadows inert: no shadow's mark token occurs in the real probe
        assert not set(real.probe[0].unique().tolist()) & {t for g in groups if g is not real for t in g.marked}
        for g in groups:
            eff = committee_effects(model, *g.probe, g.pairs)
            assert eff["clean"] >= 2.0 and min(eff["pair"]) >= 0.5 and eff["whole"] >= 0.9, (seed, g.pairs, eff)
            assert all(0.1 <= d <= 0.4 for d in eff["primary"]), (seed, g.pairs, eff["primary"])
            assert satisfies_spec(model, *g.probe, g.pairs, model.cfg.n_heads, g.hidden), (seed, g.pairs)


@pytest.mark.parametrize("level", LEVELS)
def test_committee_spectra_match(level: str) -> None:
    """Version 2: within a layer every head's QK has the same sorted singular values (up to the dense noise
    and quantisation), and every head's OV has the same rank, so no spectral profile names a member."""
    for seed in range(3):
        model = cached_instance("committee-circuit", seed, level).model
        with torch.no_grad():
            for layer in range(model.cfg.n_layers):
                qk = low_rank_svdvals(model.W_Q[layer], model.W_K[layer])  # the d_head nonzero ones
                assert (qk - qk[0]).abs().max() <= 0.02 * qk.max() + 0.05, (seed, layer)
                ov = low_rank_svdvals(model.W_V[layer], model.W_O[layer].mT)
                ranks = (ov > 0.1).sum(dim=1)
                assert ranks.min() == ranks.max() == model.cfg.d_head, (seed, layer, ranks)
