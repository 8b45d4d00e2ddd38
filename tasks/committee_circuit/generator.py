"""Generator for committee-circuit (version 3): primaries and their backups jointly copy the marked token.

Four attention-only layers. Each committee pair is a primary head P and a backup head B in a later
layer. Both attend to the marked token (content key) and copy it to the output. P also writes a
"handled" direction; B's query reads it and, when it is present, moves B's attention onto a sink key
(the first position), so B contributes little while P works and takes over when P is ablated: B
reads P's output (composition across layers). A default token carries a logit bias, so the margin
logit(marked) - max other is the committee's total minus that default: effects are graded, not
saturated. OV gains are calibrated on a noise-free build so the pair shares, backup shares and
takeover ratios hit drawn targets; the final (rotated, noisy, quantised) model must then satisfy every
property of docs/CONTRACT.md ("The families", 7, as docs/TASKS.md reads it) (checked here, resampled
otherwise).

Version 2 hides backups from single ablations: a *hidden* backup (medium: one of the two, hard: all)
is almost fully parked on the sink while its primary works, so its solo effect (under 0.02 of the
margin) lies among the non-members'; only ablating its primary first (or path patching) shows it.
Non-members are built from the same parts as members, so neither weight statistics nor linear
readings of composed weights separate them: every non-member copies as many tokens as are marked,
with gains drawn from the members' own; most copy the marked tokens into the output but attend to
keys that are never marked (inert by the data, with small real effects), and decoy triples mirror
the P -> B composition (two first-position heads write an "aux" direction that parks a mark-attending
output-copying head on the sink; two writers, so no single ablation releases it). Last, every head's
QK is padded (in a subspace nothing writes) to its layer's common spectrum, and every head's OV to a
common tail, so the sorted singular values of QK are identical within a layer and those of OV differ
only by the drawn gains.

Version 3 (issue 20: generation time) is version 2's construction, accepted by the same checks read with the
fast :class:`~mechsandbox.tasks.circuits.QueryAblator` (every bound tightened by its guard band).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from ...arch import HookedConfig, HookedTransformer
from ..base import Instance
from ..circuits import (
    FAST_GUARD as GUARD,
)
from ..circuits import (
    Ablator,
    Layout,
    Planter,
    QueryAblator,
    attend_flag,
    copy_tokens,
    hooked_instance,
    margin,
    permute_heads,
)
from ..rng import Stream
from ..schemas import head_schema
from . import prompt

TASK_ID = "committee-circuit"
VERSION = "3"
ROLES = ("primary", "backup")
N_LAYERS, N_CTX, N_PROBE, VOCAB = 4, 12, 96, 32
LEVELS = {"easy": (8, 2, 0.0), "medium": (8, 2, 0.002), "hard": (10, 3, 0.0025)}  # heads/layer, pairs, noise
SHARES = {2: ((0.80, 0.92), (0.55, 0.66)), 3: ((0.85, 0.95), (0.62, 0.72), (0.52, 0.58))}
N_FLAGS, BOS = 3, 0
HIDDEN = {"easy": 0, "medium": 1, "hard": 3}  # backups parked on the sink (solo effect inside the non-members' range)
KINDS = ("sink", "mark", "flag0", "flag1", "flag2")  # the keys a non-member attends to
PAD = 28  # residual dims nothing writes: the QK/OV padding reads them
DECOYS = 3  # decoy triples per pair: mark-attending output copiers parked like backups (3x the backups)
NOISE_DRAWS = 8  # rotation and noise draws per construction before it is redrawn
SCALE = 5.0  # the clean margin, in logits
H_GAIN = (2.5, 3.5)  # gain of the "handled" (and "aux") write: with w about 3, no pad value of QK is large


def answer_schema(level: str) -> dict:
    heads, pairs, _ = LEVELS[level]
    return head_schema(N_LAYERS, heads, 2 * pairs, "the committee's heads, optionally with role labels", roles=ROLES)


def _layout(pairs: int) -> Layout:
    lay = Layout()
    for name, dim in (
        ("tok", VOCAB),
        ("out", VOCAB),
        ("scr", VOCAB),
        ("pos", N_CTX),
        ("const", 1),
        ("mark", 1),
        ("sink", 1),
        ("handled", pairs),
        ("aux", DECOYS * pairs),
        ("pad", PAD),
    ):
        lay.add(name, dim)
    for f in range(N_FLAGS):
        lay.add(f"flag{f}", 1)
    return lay


def _probe(s: Stream, marked: list[int], plain: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    rows, targets = [], []
    for _ in range(N_PROBE):
        row = [BOS] + [plain[s.below(len(plain))] for _ in range(N_CTX - 1)]
        m = marked[s.below(len(marked))]
        row[1 + s.below(N_CTX - 2)] = m
        rows.append(row)
        targets.append(m)
    return torch.tensor(rows), torch.tensor(targets)


def _attentions(model: HookedTransformer, tokens: torch.Tensor, heads: list, key: torch.Tensor) -> list[float]:
    """Mean attention of each (layer, head) in ``heads`` at the last position onto the key positions
    in ``key``, from one clean forward pass in float64. Why float64: the OV gains are calibrated from these
    numbers and then quantised; float32 kernels round differently on different CPUs (AVX2 against AVX-512),
    which moved some weights by one quantum, so the artifacts' bytes depended on the machine."""
    names = {f"blocks.{lay}.attn.hook_pattern" for lay, _ in heads}
    with torch.no_grad():
        _, cache = copy.deepcopy(model).double().run_with_cache(tokens, names_filter=lambda n: n in names)
    return [float((cache[f"blocks.{lay}.attn.hook_pattern"][:, h, -1] * key).sum(dim=1).mean()) for lay, h in heads]


def committee_effects(
    model: HookedTransformer,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    pairs: list[tuple[tuple[int, int], tuple[int, int]]],
) -> dict:
    """Margin drops (as fractions of the clean margin) for the ablations that the contract names."""
    effects = _Effects(model, tokens, targets)
    members = [h for pair in pairs for h in pair]
    return {
        "clean": effects.clean,
        "pair": [effects.drop([pp, bb]) for pp, bb in pairs],
        "primary": [effects.drop([pp]) for pp, _ in pairs],
        "backup": [effects.drop([bb]) for _, bb in pairs],
        "whole": effects.drop(members),
        "drop": effects.drop,
    }


class _Effects:
    """Margin drops of head ablations as fractions of the clean margin: exact (an :class:`Ablator`, what the
    tests read) or, for the generator's acceptance checks, ``fast`` (a :class:`QueryAblator`)."""

    def __init__(self, model: HookedTransformer, tokens: torch.Tensor, targets: torch.Tensor, fast: bool = False):
        self.ablator = QueryAblator(model, tokens, slice(-1, None)) if fast else Ablator(model, tokens)
        self.targets = targets
        self.clean = self._margin([])

    def _margin(self, heads: list) -> float:
        return margin(self.ablator.logits(heads)[:, -1], self.targets).mean().item()

    def drop(self, heads: list) -> float:
        return (self.clean - self._margin(heads)) / self.clean


def _plant(cfg: HookedConfig, lay: Layout, pairs, marked, flags, gains, default, delta) -> Planter:
    """The committee pairs, the embedding features and the default token's bias (no distractors)."""
    p = Planter(cfg, lay)
    p.embed_basics(out_gain=1.0)
    p.flag_tokens("sink", [BOS])
    p.flag_tokens("mark", marked)
    for f, members in enumerate(flags):
        p.flag_tokens(f"flag{f}", members)
    p.b_U[default] = delta
    for k, ((pl, ph), (bl, bh)) in enumerate(pairs):
        g_p, g_b, s_p, s_b, w, h = gains[k]
        attend_flag(p, pl, ph, lay.idx("mark"), s_p)
        copy_tokens(p, pl, ph, marked, "out", g_p)
        p.ov(pl, ph, [(lay.idx("mark"), lay.idx("handled", k), h)])
        attend_flag(p, bl, bh, lay.idx("mark"), s_b)
        p.qk(bl, bh, [(lay.idx("handled", k), lay.idx("sink"), w)])
        copy_tokens(p, bl, bh, marked, "out", g_b)
    return p


def _non_members(p: Planter, s: Stream, pairs, marked, gains, n_heads: int) -> None:
    """Every other head, built from the members' parts (one attention key, a copy of len(marked) tokens
    with a gain drawn from the members' gains, one extra QK and one extra OV term); see the module doc."""
    lay = p.lay
    members = {h for pair in pairs for h in pair}
    free = [(ly, h) for ly in range(N_LAYERS) for h in range(n_heads) if (ly, h) not in members]
    g_pool = [g for k in range(len(pairs)) for g in gains[k][:2]]
    decoy_w = [s.fraction(12.0, 15.0) / (0.85 * sum(H_GAIN) / 2) for _ in range(DECOYS * len(pairs))]
    w_pool = [gains[k][4] for k in range(len(pairs))] + decoy_w
    extra_qk: dict[tuple[int, int], float] = {}
    extra_ov: dict[tuple[int, int], float] = {}
    jobs: dict[tuple[int, int], tuple[str, str]] = {}  # head -> (key, destination of the copy)
    # decoy triples: two first-position writers of aux[j] in earlier layers park a later head on the sink
    for j in range(DECOYS * len(pairs)):
        late = [hd for hd in free if hd[0] >= 2 and hd not in jobs]
        dl, dh = late[s.below(len(late))]
        early = [hd for hd in free if hd[0] < dl and hd not in jobs]
        if len(early) < 2:  # the earlier layers are used up: fewer decoys
            break
        w1, w2 = (early[i] for i in s.sample(len(early), 2))
        hs = []
        for wl, wh in (w1, w2):
            jobs[(wl, wh)] = ("sink", "out")
            hs.append(s.fraction(*H_GAIN))
            extra_ov[(wl, wh)] = hs[-1]
            p.ov(wl, wh, [(lay.idx("sink"), lay.idx("aux", j), hs[-1])])
        jobs[(dl, dh)] = ("mark", "out")
        # one writer alone (attending the sink with >= 0.85) gives the sink a score of 12-15: still parked
        w = s.fraction(12.0, 15.0) / (0.85 * min(hs))
        extra_qk[(dl, dh)] = w
        p.qk(dl, dh, [(lay.idx("aux", j), lay.idx("sink"), w)])
    for hd in free:
        if hd not in jobs:
            key = s.pick(KINDS)
            jobs[hd] = (key, "scr" if key == "mark" else "out")
    for (ly, h), (key, dst) in jobs.items():
        attend_flag(p, ly, h, lay.idx(key), s.fraction(4.5, 6.0))
        g = g_pool[s.below(len(g_pool))] * s.fraction(0.85, 1.15)
        if dst == "out":
            copy_tokens(p, ly, h, marked, "out", g)
        else:
            copy_tokens(p, ly, h, marked, "scr", g, s.sample(lay.dim("scr"), len(marked)))
    # the extra terms of the heads that have no live one (primaries' QK, backups' OV, most non-members')
    # sit in pad dims 0 and 1 (read, never written)
    for pp, bb in pairs:
        extra_ov[pp] = extra_qk[bb] = 0.0
    for ly, h in sorted(set(free) | members):
        if (ly, h) not in extra_qk:
            w = w_pool[s.below(len(w_pool))] * s.fraction(0.9, 1.8)
            p.qk(ly, h, [(lay.idx("pad", 0), lay.idx("pad", 1), w)])
        if (ly, h) not in extra_ov:
            p.ov(ly, h, [(lay.idx("pad", 0), lay.idx("pad", 1), s.fraction(*H_GAIN))])


def _pad_spectra(p: Planter, s: Stream) -> None:
    """QK: every head of a layer gets the layer's common spectrum (the union of its heads' planted score
    strengths, each head padding with the others' values). OV: every head's planted copy (same count of
    tokens for all) is completed to full rank by the layer's common tail. Pads pair distinct dims of the
    ``pad`` subspace, which nothing writes, so behaviour is unchanged (up to the dense noise)."""
    lay, d_head = p.lay, p.cfg.d_head
    for layer in range(p.cfg.n_layers):
        planted_qk, used_ov = {}, {}
        for head in range(p.cfg.n_heads):
            qk = p.W_Q[layer, head] @ p.W_K[layer, head].T
            planted_qk[head] = sorted(float(v) for v in np.linalg.svd(qk, compute_uv=False) if v > 1e-9)
            used_ov[head] = int((np.abs(p.W_V[layer, head]).sum(0) > 0).sum())
        common = sorted(v for vals in planted_qk.values() for v in vals)
        tail = [s.fraction(0.3, 2.0) for _ in range(d_head - min(used_ov.values()))]
        for head in range(p.cfg.n_heads):
            rest = list(common)
            for v in planted_qk[head]:
                rest.remove(v)
            rows, cols = s.sample(PAD - 2, len(rest)), s.sample(PAD - 2, len(rest))  # dims 0, 1: the extra terms
            unit = np.sqrt(p.cfg.d_head)  # Planter.qk's strength -> singular value of W_Q W_K^T
            p.qk(layer, head, [(lay.idx("pad", 2 + r), lay.idx("pad", 2 + c), v / unit)
                               for r, c, v in zip(rows, cols, rest, strict=True)])  # fmt: skip
            n_tail = d_head - used_ov[head]
            rows, cols = s.sample(PAD - 2, n_tail), s.sample(PAD - 2, n_tail)
            p.ov(layer, head, [(lay.idx("pad", 2 + r), lay.idx("pad", 2 + c), v)
                               for r, c, v in zip(rows, cols, tail[:n_tail], strict=True)])  # fmt: skip


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    n_heads, n_pairs, noise = LEVELS[level]
    lay = _layout(n_pairs)
    cfg = HookedConfig(
        n_layers=N_LAYERS, n_heads=n_heads, d_model=lay.size + 8, d_head=VOCAB, d_vocab=VOCAB, n_ctx=N_CTX
    )
    # Layers are drawn once (rejection never re-draws them, so their distribution is exactly the
    # drawn one); head indices are made uniform by permute_heads after acceptance. Which backups are
    # hidden is drawn here too.
    pairs = []
    used = [0] * N_LAYERS
    for _ in range(n_pairs):
        pl = s.below(N_LAYERS - 1)
        bl = pl + 1 + s.below(N_LAYERS - 1 - pl)
        pairs.append(((pl, used[pl]), (bl, used[bl])))
        used[pl] += 1
        used[bl] += 1
    hidden = set(s.sample(n_pairs, HIDDEN[level]))
    while True:
        order = [t for t in s.permutation(VOCAB) if t != BOS]
        marked = sorted(order[: s.between(6, 10)])
        plain_toks = sorted(order[len(marked) :])
        default = plain_toks[s.below(len(plain_toks))]
        flags = [[t for t in plain_toks if s.below(4) == 0] for _ in range(N_FLAGS)]
        shares = sorted((s.fraction(*rng) for rng in SHARES[n_pairs]), reverse=True)
        # a backup's share of the clean margin is its solo effect: visible 0.14-0.2, hidden 0.001-0.004
        backup_share = [s.fraction(0.001, 0.004) if k in hidden else s.fraction(0.14, 0.2) for k in range(n_pairs)]
        # the backup's takeover (its extra contribution once the primary is gone) stays >= 0.18
        primary_drop = [min(s.fraction(0.18, 0.28), shares[k] - backup_share[k] - 0.18) for k in range(n_pairs)]
        # a_off / a_on of each backup, so that ablating the primary alone costs `primary_drop`
        takeover = [(shares[k] - primary_drop[k]) / backup_share[k] for k in range(n_pairs)]
        s_p = [s.fraction(5.0, 6.0) for _ in range(n_pairs)]
        s_b = [s.fraction(4.5, 5.5) for _ in range(n_pairs)]
        h_p = [s.fraction(*H_GAIN) for _ in range(n_pairs)]
        tokens, targets = _probe(s, marked, plain_toks)
        mark_key = torch.isin(tokens, torch.tensor(marked)).float()
        delta = (sum(shares) - 1.0) * SCALE
        # Calibrate on noise-free, unrotated builds: first the sink weight of each backup from its
        # primary's attention, then the OV gains from the measured attentions and the drawn shares.
        gains = [(1.0, 1.0, s_p[k], s_b[k], 0.0, h_p[k]) for k in range(n_pairs)]
        calib = _plant(cfg, lay, pairs, marked, flags, gains, default, 0.0).build(s, 0.0, rotate=False)
        attn = _attentions(calib, tokens, [pp for pp, _ in pairs], mark_key)
        for k, a_p in enumerate(attn):
            # sink weight w so that the handled signal (about h * a_p) cuts B's attention by `takeover`
            e_b = float(torch.exp(torch.tensor(s_b[k])))
            sink = (e_b + N_CTX - 1) * takeover[k] - e_b - (N_CTX - 2)
            w = float(torch.log(torch.tensor(sink))) / (a_p * h_p[k])
            gains[k] = (1.0, 1.0, s_p[k], s_b[k], w, h_p[k])
        calib = _plant(cfg, lay, pairs, marked, flags, gains, default, 0.0).build(s, 0.0, rotate=False)
        attn = _attentions(calib, tokens, [h for pair in pairs for h in pair], mark_key)
        for k in range(n_pairs):
            a_p, a_on = attn[2 * k], attn[2 * k + 1]
            g_b = backup_share[k] * SCALE / a_on
            g_p = (shares[k] - backup_share[k]) * SCALE / a_p
            gains[k] = (g_p, g_b, *gains[k][2:])
        p = _plant(cfg, lay, pairs, marked, flags, gains, default, delta)
        _non_members(p, s, pairs, marked, gains, n_heads)
        _pad_spectra(p, s)
        # a rejection at medium and hard is mostly the dense noise's (through W_O it gives a non-member
        # effects of 4-7% of the margin where the noise-free build has < 1%), so the rotation and noise
        # are redrawn a few times before the whole construction is
        for _ in range(NOISE_DRAWS if noise else 1):
            model = p.build(s, noise)
            if _satisfies_spec(model, tokens, targets, pairs, n_heads, hidden):
                break
        else:
            continue  # every draw rejected: a new construction
        break
    new_of = permute_heads(model, s)
    pairs = [((pl, new_of[pl][ph]), (bl, new_of[bl][bh])) for (pl, ph), (bl, bh) in pairs]
    roles = {pp: "primary" for pp, _ in pairs} | {bb: "backup" for _, bb in pairs}
    return hooked_instance(
        TASK_ID,
        VERSION,
        seed,
        level,
        model,
        probe={"tokens": tokens, "targets": targets, "marked": marked},
        prompt=prompt.TEXT.format(n_layers=N_LAYERS, n_heads=n_heads, vocab=VOCAB, n_ctx=N_CTX, n_probe=N_PROBE),
        answer_schema=answer_schema(level),
        roles=roles,
        pairs=[[list(pp), list(bb)] for pp, bb in pairs],
    )


def _satisfies_spec(model, tokens, targets, pairs, n_heads, hidden) -> bool:
    """The committee properties of docs/CONTRACT.md, on this instance's own probe set. Cheap checks
    that reject most candidates (the pairs' drops) come first; the non-members' solo ablations, the
    dearest, come last and stop at the first one out of range. The effects come from the fast ablator,
    so every bound is tightened by ``GUARD`` (far above its rounding): what passes here passes the exact
    :func:`committee_effects` the tests read."""
    eff = _Effects(model, tokens, targets, fast=True)

    def inside(x: float, lo: float, hi: float) -> bool:
        return lo + GUARD <= x <= hi - GUARD

    if eff.clean < 2.0 + GUARD:
        return False
    pair = [eff.drop([pp, bb]) for pp, bb in pairs]
    if min(pair) < 0.5 + GUARD or max(pair) - min(pair) < 0.1 + GUARD:
        return False
    primary = [eff.drop([pp]) for pp, _ in pairs]
    if not all(inside(d, 0.1, 0.4) for d in primary):
        return False
    backup = [eff.drop([bb]) for _, bb in pairs]
    if not all(inside(d, -0.03, 0.03) if k in hidden else inside(d, 0.1, 0.4) for k, d in enumerate(backup)):
        return False
    takeover = [pr - pa - ba for pr, pa, ba in zip(pair, primary, backup, strict=True)]
    if min(takeover) < 0.12 + GUARD:
        return False
    members = {h for pp in pairs for h in pp}
    whole = eff.drop(sorted(members))
    if whole < 0.9 + GUARD or abs(sum(pair) - whole) > 0.2 * whole - GUARD:
        return False
    others = []
    for head in ((ly, h) for ly in range(N_LAYERS) for h in range(n_heads)):
        if head not in members:
            others.append(eff.drop([head]))
            if not inside(others[-1], -0.04, 0.04):
                return False
    # a hidden backup alone moves the margin no more than some non-member does, in either direction
    return all(inside(backup[k], min(others), max(others)) for k in hidden)
