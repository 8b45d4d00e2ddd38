"""Generator for committee-circuit (version 5): primaries and their backups jointly copy the marked token.

Four attention-only layers. Each committee pair is a primary head P and a backup head B in a later
layer. Both attend to the marked token (content key) and copy it to the output. P also writes a
"handled" direction; B's query reads it and, when it is present, moves B's attention onto a sink key
(the first position), so B contributes little while P works and takes over when P is ablated: B
reads P's output (composition across layers). A default token carries a logit bias, so the margin
logit(marked) - max other is the committee's total minus that default: effects are graded, not
saturated. OV gains are calibrated on the planted (noise-free) model so the pair shares, backup shares and
takeover ratios hit drawn targets; the final (rotated, noisy, quantised) model must then satisfy every
property of docs/CONTRACT.md ("The families", 7, as docs/TASKS.md reads it) (checked here, resampled
otherwise).

Hidden backups (version 2; medium: one of the two, hard: all) are almost fully parked on the sink while
their primary works, so a hidden backup's solo effect (under 0.02 of the margin) lies among the
non-members'; only ablating its primary first (or path patching) shows it.

Version 4 (issue 16: a learned reading of the composed weights named the members, 0.89) makes the members
a matter of the data: the model holds ``GROUPS`` complete committees, each with its own mark feature carried
by its own token set, drawn, calibrated (each on a probe of its own marks) and planted by the same code;
one of them, drawn uniformly, is real: the probe marks only its tokens. The others (shadows) attend keys that
never occur in the probe, so they are inert by the data, while no reading of the weights alone can tell
which committee the probe uses (the default token's bias is tied to every group in the same way: each
group's margin scale is set from it). Every other head is built from the members' parts: one attention key
(the sink, a group's mark, or a flag of plain tokens), a copy of one group's marked tokens with a gain drawn
from the members' gains (to scratch when its key is a mark), one extra QK and one extra OV term (live or in
a pad subspace nothing writes); then every head's QK is padded to its layer's common spectrum and its OV to a
common tail, so the sorted singular values of QK are identical within a layer and those of OV differ only by
the drawn gains. Every group gets two output copiers of its tokens that attend the sink loosely, one with a positive
gain and one with a negative gain (version 5), both drawn from the primaries' gains: their leaks (about +-1% of the
margin) are what a hidden backup's solo effect lies among on that group's probe, on either side. Version 4 had the
positive one only, with a gain that could be a hidden backup's: on a probe of its own marks a hard shadow's hidden
backup then often fell outside its non-members' range (11 of 20 shadows passed the checks), so running the checks on
every group's probe ruled shadows out; with both copiers 39 of 40 pass at hard and 40 of 40 at medium
(docs/TASKS.md, item 7). Version 3's decoy triples are gone (the shadows mirror the whole composition). Acceptance
reads the fast :class:`~mechsandbox.tasks.circuits.QueryAblator` (every bound tightened by its guard band), on the
real group only: the shadows pass by construction (the rate above is tested), not by selection.
"""

from __future__ import annotations

import dataclasses

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
VERSION = "5"
ROLES = ("primary", "backup")
N_LAYERS, N_CTX, N_PROBE, VOCAB = 4, 12, 96, 48
GROUPS = 5  # committees planted, on one layer layout; one, drawn uniformly, is the one the probe uses
MARKED = (5, 7)  # tokens per group's mark
D_HEAD = 32  # the OV tail pads a head to full rank from PAD - 2 dims: d_head - 6 (5 marks, 1 extra) <= PAD - 2
LEVELS = {"easy": (8, 2, 0.0), "medium": (8, 2, 0.002), "hard": (10, 3, 0.0025)}  # heads/layer, pairs, noise
SHARES = {2: ((0.80, 0.92), (0.55, 0.66)), 3: ((0.85, 0.95), (0.62, 0.72), (0.52, 0.58))}
N_FLAGS, BOS = 3, 0
HIDDEN = {"easy": 0, "medium": 1, "hard": 3}  # backups parked on the sink (solo effect inside the non-members' range)
KINDS = ("sink", "mark", "flag0", "flag1", "flag2")  # the keys a non-member attends to (mark: any group's)
PAD = 28  # residual dims nothing writes: the QK pads and the OV tails read them (the tails write "padw")
NOISE_DRAWS = 8  # rotation and noise draws per construction before it is redrawn
SCALE = 5.0  # the typical clean margin, in logits (each seed's: the bias over the real group's share sum)
H_GAIN = (2.5, 3.5)  # gain of the "handled" write: with w about 3, no pad value of QK is large


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
        ("sink", 1),
        ("handled", GROUPS * pairs),
        ("pad", PAD),
        ("padw", PAD - 2),
    ):
        lay.add(name, dim)
    for f in range(N_FLAGS):
        lay.add(f"flag{f}", 1)
    for g in range(GROUPS):
        lay.add(f"mark{g}", 1)
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


def _attentions(p: Planter, groups: list[Committee], heads_of) -> list[list[float]]:
    """For each group, the mean attention of each head in ``heads_of(group)`` at the last position onto the
    group's marked tokens, on the group's own probe, in the planted (noise-free, unrotated) model, in float64:
    one :meth:`Planter.patterns` pass over every group's probe at once. Why float64: the OV gains are calibrated
    from these numbers and then quantised; float32 kernels round differently on different CPUs (AVX2 against
    AVX-512), which moved some weights by one quantum, so the artifacts' bytes depended on the machine."""
    tokens = torch.cat([g.probe[0] for g in groups])
    pats = p.patterns(tokens, sorted({h for g in groups for h in heads_of(g)}))
    out, row = [], 0
    for g in groups:
        rows = slice(row, row + len(g.probe[0]))
        key = torch.isin(g.probe[0], torch.tensor(g.marked)).double().numpy()
        out.append([float((pats[h][rows, -1] * key).sum(axis=1).mean()) for h in heads_of(g)])
        row = rows.stop
    return out


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


@dataclasses.dataclass
class Committee:
    """One committee as drawn: the real one, or a shadow built the same way (see the module doc)."""

    pairs: list[tuple[tuple[int, int], tuple[int, int]]]
    hidden: set[int]
    marked: list[int] = dataclasses.field(default_factory=list)
    gains: list[tuple[float, ...]] = dataclasses.field(default_factory=list)
    draws: dict = dataclasses.field(default_factory=dict)
    probe: tuple[torch.Tensor, torch.Tensor] | None = None


def _draw_layers(s: Stream, n_pairs: int, n_heads: int) -> list[Committee]:
    """One layer layout (primary below backup, per pair) shared by every group, redrawn until every layer holds
    its groups' members; head indices are assigned in order here and made uniform by permute_heads after
    acceptance. Why shared: with a layout per group, the answer's count per layer (which the audit tells its
    most generous strategies) picked the real group's layers among the others' (0.26 at best with five groups,
    against 0.19 with one layout: docs/TASKS.md)."""
    while True:
        layout = []
        for _ in range(n_pairs):
            pl = s.below(N_LAYERS - 1)
            layout.append((pl, pl + 1 + s.below(N_LAYERS - 1 - pl)))
        per_layer = [sum((pl == ly) + (bl == ly) for pl, bl in layout) for ly in range(N_LAYERS)]
        if GROUPS * max(per_layer) <= n_heads:
            break
    used = [0] * N_LAYERS
    groups = []
    for _ in range(GROUPS):
        pairs = []
        for pl, bl in layout:
            pairs.append(((pl, used[pl]), (bl, used[bl])))
            used[pl] += 1
            used[bl] += 1
        groups.append(Committee(pairs=pairs, hidden=set()))
    return groups


def _draw_targets(s: Stream, g: Committee, n_pairs: int) -> None:
    """A group's drawn targets: pair shares, backup shares (visible 0.14-0.2, hidden 0.0005-0.002), the
    primary-alone drops, the backups' takeover ratios and the attention and handled strengths."""
    shares = sorted((s.fraction(*rng) for rng in SHARES[n_pairs]), reverse=True)
    backup = [s.fraction(0.0005, 0.002) if k in g.hidden else s.fraction(0.14, 0.2) for k in range(n_pairs)]
    # the backup's takeover (its extra contribution once the primary is gone) stays >= 0.18
    primary_drop = [min(s.fraction(0.18, 0.28), shares[k] - backup[k] - 0.18) for k in range(n_pairs)]
    g.draws = {
        "shares": shares,
        "backup": backup,
        # a_off / a_on of each backup, so that ablating the primary alone costs `primary_drop`
        "takeover": [(shares[k] - primary_drop[k]) / backup[k] for k in range(n_pairs)],
        "s_p": [s.fraction(5.0, 6.0) for _ in range(n_pairs)],
        "s_b": [s.fraction(4.5, 5.5) for _ in range(n_pairs)],
        "h_p": [s.fraction(*H_GAIN) for _ in range(n_pairs)],
    }


def _plant(cfg: HookedConfig, lay: Layout, groups: list[Committee], flags, default: int, delta: float) -> Planter:
    """Every group's committee pairs, the embedding features and the default token's bias (no non-members)."""
    p = Planter(cfg, lay)
    p.embed_basics(out_gain=1.0)
    p.flag_tokens("sink", [BOS])
    for gi, g in enumerate(groups):
        p.flag_tokens(f"mark{gi}", g.marked)
    for f, members in enumerate(flags):
        p.flag_tokens(f"flag{f}", members)
    p.b_U[default] = delta
    for gi, g in enumerate(groups):
        for k, ((pl, ph), (bl, bh)) in enumerate(g.pairs):
            g_p, g_b, s_p, s_b, w, h = g.gains[k]
            handled = lay.idx("handled", gi * len(g.pairs) + k)
            attend_flag(p, pl, ph, lay.idx(f"mark{gi}"), s_p)
            copy_tokens(p, pl, ph, g.marked, "out", g_p)
            p.ov(pl, ph, [(lay.idx(f"mark{gi}"), handled, h)])
            attend_flag(p, bl, bh, lay.idx(f"mark{gi}"), s_b)
            p.qk(bl, bh, [(handled, lay.idx("sink"), w)])
            copy_tokens(p, bl, bh, g.marked, "out", g_b)
    return p


def _calibrate(
    cfg: HookedConfig, lay: Layout, groups: list[Committee], flags, default: int, scale: list[float]
) -> None:
    """OV gains and sink weights of every group, each on its own probe, read in the planted (noise-free,
    unrotated) model's attention (``Planter.patterns``): first the sink weight of each backup from its primary's
    attention, then the OV gains from the measured attentions and the drawn shares (``scale[g]``: the margin the
    group would give if it were the real one). A group's heads are inert on another group's probe (its mark is
    absent there), so one planted model serves all groups."""
    for g in groups:
        d = g.draws
        g.gains = [(1.0, 1.0, d["s_p"][k], d["s_b"][k], 0.0, d["h_p"][k]) for k in range(len(g.pairs))]
    calib = _plant(cfg, lay, groups, flags, default, 0.0)
    for g, attn in zip(groups, _attentions(calib, groups, lambda g: [pp for pp, _ in g.pairs]), strict=True):
        d = g.draws
        for k, a_p in enumerate(attn):
            # sink weight w so that the handled signal (about h * a_p) cuts B's attention by `takeover`
            e_b = float(torch.exp(torch.tensor(d["s_b"][k])))
            sink = (e_b + N_CTX - 1) * d["takeover"][k] - e_b - (N_CTX - 2)
            w = float(torch.log(torch.tensor(sink))) / (a_p * d["h_p"][k])
            g.gains[k] = (1.0, 1.0, d["s_p"][k], d["s_b"][k], w, d["h_p"][k])
    calib = _plant(cfg, lay, groups, flags, default, 0.0)
    members = _attentions(calib, groups, lambda g: [h for pair in g.pairs for h in pair])
    for gi, (g, attn) in enumerate(zip(groups, members, strict=True)):
        d = g.draws
        for k in range(len(g.pairs)):
            a_p, a_on = attn[2 * k], attn[2 * k + 1]
            g_b = d["backup"][k] * scale[gi] / a_on
            g_p = (d["shares"][k] - d["backup"][k]) * scale[gi] / a_p
            g.gains[k] = (g_p, g_b, *g.gains[k][2:])


def _non_members(p: Planter, s: Stream, groups: list[Committee], n_heads: int) -> None:
    """Every head outside the groups, built from the members' parts: one attention key (the sink, a group's
    mark or a flag of plain tokens), a copy of one group's marked tokens with a gain drawn from the members'
    gains (into the output, or into scratch when the key is a mark), one extra QK and one extra OV term."""
    lay = p.lay
    members = {h for g in groups for pair in g.pairs for h in pair}
    free = [(ly, h) for ly in range(N_LAYERS) for h in range(n_heads) if (ly, h) not in members]
    g_pool = [gain for g in groups for k in range(len(g.pairs)) for gain in g.gains[k][:2]]
    w_pool = [g.gains[k][4] for g in groups for k in range(len(g.pairs))]
    p_pool = [g.gains[k][0] for g in groups for k in range(len(g.pairs))]  # the primaries' (never a hidden backup's)
    # every group gets two heads that copy its tokens into the output while attending the sink a little more
    # loosely (strength 3.5-4.5: about 1.5% of its attention reaches the marked token), one with a positive gain
    # and one with a negative gain drawn from the primaries' (about +1% and -1% of the margin), so a hidden
    # backup's solo effect lies among the non-members' on its group's probe by design, for the real group and the
    # shadows alike; the rest draw their group and key freely (none are left at hard: 40 heads, 30 members)
    order = [free[i] for i in s.permutation(len(free))]
    loose = 2 * GROUPS
    for i, (ly, h) in enumerate(order):
        key = "sink" if i < loose else s.pick(KINDS)
        strength = s.fraction(3.5, 4.5) if i < loose else s.fraction(4.5, 6.0)
        src = groups[i % GROUPS if i < loose else s.below(GROUPS)].marked
        pool = p_pool if i < loose else g_pool
        gain = pool[s.below(len(pool))] * s.fraction(0.85, 1.15) * (-1.0 if GROUPS <= i < loose else 1.0)
        if key == "mark":
            attend_flag(p, ly, h, lay.idx(f"mark{s.below(GROUPS)}"), strength)
            copy_tokens(p, ly, h, src, "scr", gain, s.sample(lay.dim("scr"), len(src)))
        else:
            attend_flag(p, ly, h, lay.idx(key), strength)
            copy_tokens(p, ly, h, src, "out", gain)
    # the extra terms of the heads that have no live one (primaries' QK, backups' OV, every non-member's)
    # sit in pad dims 0 and 1 (read, never written)
    live_qk = {bb for g in groups for _, bb in g.pairs}
    live_ov = {pp for g in groups for pp, _ in g.pairs}
    for ly, h in sorted(set(free) | members):
        if (ly, h) not in live_qk:
            w = w_pool[s.below(len(w_pool))] * s.fraction(0.9, 1.8)
            p.qk(ly, h, [(lay.idx("pad", 0), lay.idx("pad", 1), w)])
        if (ly, h) not in live_ov:
            p.ov(ly, h, [(lay.idx("pad", 0), lay.idx("pad", 1), s.fraction(*H_GAIN))])


def _pad_spectra(p: Planter, s: Stream) -> None:
    """QK: every head of a layer gets the layer's common spectrum (the union of its heads' planted score
    strengths, each head padding with the others' values). OV: every head's planted copy (same count of
    tokens for all) is completed to full rank by the layer's common tail. QK pads pair distinct dims of the
    ``pad`` subspace, which nothing writes, so behaviour is unchanged (up to the dense noise); the OV tails read
    ``pad`` too and write ``padw``, which nothing reads. (Version 3 wrote the tails back into ``pad``: every
    layer then multiplied the noise in ``pad`` by its tails and the next layers' QK pads read it as attention
    noise, up to a logit, which made most noisy builds fail the checks.)"""
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
            p.ov(layer, head, [(lay.idx("pad", 2 + r), lay.idx("padw", c), v)
                               for r, c, v in zip(rows, cols, tail[:n_tail], strict=True)])  # fmt: skip


def build_committees(seed: int, level: str) -> tuple[HookedTransformer, list[Committee], Committee, Stream]:
    """The accepted model with every planted committee (heads before the final permutation) and the real one;
    :func:`generate` permutes the heads and keeps only the real committee as the truth."""
    s = Stream(seed, f"{TASK_ID}/{level}")
    n_heads, n_pairs, noise = LEVELS[level]
    lay = _layout(n_pairs)
    cfg = HookedConfig(
        n_layers=N_LAYERS, n_heads=n_heads, d_model=lay.size + 8, d_head=D_HEAD, d_vocab=VOCAB, n_ctx=N_CTX
    )
    # Layers, which group is real and which backups are hidden are drawn once (rejection never re-draws them,
    # so their distribution is exactly the drawn one, up to the layers' capacity check).
    groups = _draw_layers(s, n_pairs, n_heads)
    for g in groups:
        g.hidden = set(s.sample(n_pairs, HIDDEN[level]))
    real = groups[s.below(GROUPS)]
    while True:
        order = [t for t in s.permutation(VOCAB) if t != BOS]
        for g in groups:
            size = s.between(*MARKED)
            g.marked, order = sorted(order[:size]), order[size:]
        plain_toks = sorted(order)
        default = plain_toks[s.below(len(plain_toks))]
        # a flag holds a third of the plain tokens, so nearly every probe row holds each flag: a row without its
        # flag spreads a flag-reading head's attention over every position, marked one included (a real effect)
        flags = [sorted(plain_toks[i] for i in s.sample(len(plain_toks), len(plain_toks) // 3)) for _ in range(N_FLAGS)]
        for g in groups:
            _draw_targets(s, g, n_pairs)
            g.probe = _probe(s, g.marked, plain_toks)
        # the default's bias comes from one more draw of shares, and each group's margin scale from it: every
        # group (the real one among them) relates to the bias in the same way
        phantom = sum(s.fraction(*rng) for rng in SHARES[n_pairs])
        delta = (phantom - 1.0) * SCALE
        scale = [delta / (sum(g.draws["shares"]) - 1.0) for g in groups]
        _calibrate(cfg, lay, groups, flags, default, scale)
        p = _plant(cfg, lay, groups, flags, default, delta)
        _non_members(p, s, groups, n_heads)
        _pad_spectra(p, s)
        # a rejection at medium and hard is mostly the dense noise's (through W_O it gives a non-member
        # effects of 4-7% of the margin where the noise-free build has < 1%), so the rotation and noise
        # are redrawn a few times before the whole construction is
        tokens, targets = real.probe
        for _ in range(NOISE_DRAWS if noise else 1):
            model = p.build(s, noise)
            if satisfies_spec(model, tokens, targets, real.pairs, n_heads, real.hidden):
                break
        else:
            continue  # every draw rejected: a new construction
        break
    return model, groups, real, s


def generate(seed: int, level: str) -> Instance:
    n_heads = LEVELS[level][0]
    model, _, real, s = build_committees(seed, level)
    tokens, targets = real.probe
    new_of = permute_heads(model, s)
    pairs = [((pl, new_of[pl][ph]), (bl, new_of[bl][bh])) for (pl, ph), (bl, bh) in real.pairs]
    roles = {pp: "primary" for pp, _ in pairs} | {bb: "backup" for _, bb in pairs}
    return hooked_instance(
        TASK_ID,
        VERSION,
        seed,
        level,
        model,
        probe={"tokens": tokens, "targets": targets, "marked": real.marked},
        prompt=prompt.TEXT.format(n_layers=N_LAYERS, n_heads=n_heads, vocab=VOCAB, n_ctx=N_CTX, n_probe=N_PROBE),
        answer_schema=answer_schema(level),
        roles=roles,
        pairs=[[list(pp), list(bb)] for pp, bb in pairs],
    )


def satisfies_spec(model, tokens, targets, pairs, n_heads, hidden) -> bool:
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
