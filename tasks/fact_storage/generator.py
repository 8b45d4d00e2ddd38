"""Generator for fact-storage (version 2): subject -> attribute facts stored in one layer's MLP at one
of the subject's positions (ROME-style), found by causal tracing.

Construction, in a named basis that ``Planter.build`` then rotates:
- vocabulary: subject-part tokens, filler tokens, attribute tokens. A subject is a run of 4-6
  subject-part tokens at a seed-chosen span; every adjacent pair of parts (a *window*) names one
  subject: the pairs of all subjects at all windows are distinct, so any window could store the fact.
- layer 0: a previous-token head copies the previous subject part into ``prev1`` at each position (an
  offset-2 head copies into ``prev2``, which nothing reads), so a unit can AND (prev1, tok).
- every MLP layer has the same roster of AND units (two reads with jittered weights, a bias just
  below their sum): 24 "attribute" units that write an attribute (plus a dense scratch part), 16
  scratch units reading subject pairs, 8 filler-pattern units. In the *fact layer* the attribute units
  read the facts' pairs at one window, drawn per seed, so they fire at that window's end -- the storing
  position p, not always the last subject token; one *secondary* layer stores a few facts at another
  window; every other attribute unit reads a subject-like pair that occurs in no prompt (inert by the
  data distribution, not by cancelling weights). No pair is read by two attribute units, all gains
  are drawn alike, so per-layer weight statistics, ranks and the composition W_out -> readout ->
  unembedding are the same in every layer.
- the last layer's readout head attends uniformly and copies ``attr`` to ``out``, which the
  unembedding reads as attribute logits at the last position.
Corruption is subject-token replacement (symmetric token replacement; Gaussian noise on the subject's
embeddings is unreliable here, as in trained models: it also writes straight into the directions the
readout copies; see Zhang & Nanda 2023). Restoring the fact layer's MLP output at p in a corrupted
run brings back most of the clean logit difference; the secondary layer's cell the rest; every other
cell about nothing. Restoring the *residual* at p plateaus at full recovery for every layer up to
the fact layer, which is why the answer is defined on MLP outputs. The generator checks the trace
with a margin. Version 1 (retired) stored at the last subject token with duplicated output rows.
"""

from __future__ import annotations

import numpy as np
import torch

from ...answer_kind import AnswerKind
from ...arch import HookedConfig, HookedTransformer
from ..base import Instance
from ..circuits import Ablator, Layout, Planter, attend_offset, copy_tokens, distractor_job
from ..rng import Stream
from . import prompt

TASK_ID = "fact-storage"
VERSION = "2"
N_SUBJ, N_FILL, N_ATTR = 16, 8, 8  # N_SUBJ <= d_head: the previous-token head copies each part
N_FACTS = 24
N_HEADS = 4
N_ATTR_UNITS, N_SCR_UNITS, N_FILL_UNITS = N_FACTS, 16, 8  # the roster of every MLP layer
LEVELS = {  # n_layers, n_ctx, subject span lengths, noise, corrupted prompts given
    "easy": (6, 10, (4, 5, 6), 0.0, True),
    "medium": (6, 11, (4, 5, 6), 0.01, False),
    "hard": (7, 12, (4, 5), 0.02, False),  # (6 would need more than the N_SUBJ**2 pairs: see _plan)
}
NORM = (1.6, 2.4)  # every unit's output-row norm
ATTR_SHARE = (0.75, 0.95)  # an attribute unit's share of its row norm in ``attr`` (the rest: scratch)
N_SECOND = (3, 7)  # facts the secondary layer also stores (at another window)
PEAK_MARGIN = 0.75  # every other cell's recovery <= 0.75 x the peak's, on both corruptions


def _layout(n_ctx: int) -> Layout:
    lay = Layout()
    vocab = N_SUBJ + N_FILL + N_ATTR
    for name, dim in (("tok", vocab), ("prev1", N_SUBJ), ("prev2", N_SUBJ), ("attr", N_ATTR), ("out", N_ATTR),
                      ("scr", 24), ("pos", n_ctx), ("const", 1), ("flag0", 1)):  # fmt: skip
        lay.add(name, dim)
    return lay


def answer_schema(level: str) -> dict:
    n_layers, n_ctx = LEVELS[level][:2]
    return {
        "type": "object",
        "properties": {
            "layer": {"type": "integer", "minimum": 0, "maximum": n_layers - 1},
            "position": {"type": "integer", "minimum": 0, "maximum": n_ctx - 1},
        },
        "required": ["layer", "position"],
        "description": "the (layer, position) cell where restoring the MLP output recovers the fact most",
        "x-kind": AnswerKind.CELL,
        "x-universe": n_layers * n_ctx,
        "x-k-max": 1,
        "x-n-layers": n_layers,
        "x-n-positions": n_ctx,
    }


def windows(sub: tuple[int, ...]) -> list[tuple[int, int]]:
    """The adjacent pairs (previous part, part) of a subject; window j ends at span start + j + 1."""
    return [(sub[j], sub[j + 1]) for j in range(len(sub) - 1)]


def _subjects(s: Stream, m: int) -> list[tuple[int, ...]]:
    """N_FACTS subject tuples of m parts whose window pairs are all distinct (across subjects and
    windows), so every window names its subject and none fires elsewhere in a clean prompt."""
    while True:
        used: set[tuple[int, int]] = set()
        picked: list[tuple[int, ...]] = []
        for _ in range(N_FACTS * 20):
            sub = tuple(s.below(N_SUBJ) for _ in range(m))
            pairs = windows(sub)
            if len(set(pairs)) == len(pairs) and not used & set(pairs):
                picked.append(sub)
                used |= set(pairs)
                if len(picked) == N_FACTS:
                    return picked


def _prompts(s: Stream, subjects: list[tuple[int, ...]], start: int, n_ctx: int) -> torch.Tensor:
    m = len(subjects[0])
    rows = []
    for _ in range(2):
        for sub in subjects:
            fill = [N_SUBJ + s.below(N_FILL) for _ in range(n_ctx)]
            fill[start : start + m] = list(sub)
            rows.append(fill)
    return torch.tensor(rows)


def metric(model: HookedTransformer, tokens: torch.Tensor, targets: torch.Tensor, logits=None) -> float:
    """Mean over prompts of logit(target attribute) - mean attribute logit, at the last position."""
    if logits is None:
        with torch.no_grad():
            logits = model(tokens)
    attr = logits[:, -1, N_SUBJ + N_FILL :]
    tgt = attr.gather(1, (targets - N_SUBJ - N_FILL)[:, None])[:, 0]
    return float((tgt - attr.mean(dim=1)).mean())


def trace(model: HookedTransformer, clean: torch.Tensor, corrupt: torch.Tensor, targets: torch.Tensor,
          site: str = "mlp_out") -> torch.Tensor:  # fmt: skip
    """Recovery [n_layers, n_ctx] when the clean ``hook_<site>`` activation is restored at one
    (layer, position) of the corrupted run: (m_restored - m_corrupt) / (m_clean - m_corrupt).
    All positions of a layer run as one pass over the repeated batch, from the corrupted stream entering that
    layer (an :class:`Ablator` of the repeated batch keeps it: bit-identical to a whole forward pass)."""
    n, n_ctx = clean.shape
    names = [f"blocks.{lay}.hook_{site}" for lay in range(model.cfg.n_layers)]
    with torch.no_grad():
        logits, cache = model.run_with_cache(clean, names_filter=lambda name: name in names)
        m_clean = metric(model, clean, targets, logits)
        m_corrupt = metric(model, corrupt, targets)
    batch, many_targets = corrupt.repeat(n_ctx, 1), targets.repeat(n_ctx)
    corrupted_run = Ablator(model, batch)
    out = torch.zeros(model.cfg.n_layers, n_ctx)
    for lay, name in enumerate(names):

        def restore(act, hook, name=name):
            for pos in range(n_ctx):
                act[pos * n : (pos + 1) * n, pos] = cache[name][:, pos]
            return act

        logits = corrupted_run.run_from(lay, [(name, restore)])
        for pos in range(n_ctx):
            rows = slice(pos * n, (pos + 1) * n)
            m = metric(model, batch[rows], many_targets[rows], logits[rows])
            out[lay, pos] = (m - m_corrupt) / (m_clean - m_corrupt)
    return out


def replace_subjects(s: Stream, tokens: torch.Tensor, start: int, m: int, pairs: set[tuple[int, int]]) -> torch.Tensor:
    """Token corruption: each prompt's subject replaced by random subject parts none of whose
    windows is a fact's pair."""
    out = tokens.clone()
    for row in out:
        while True:
            sub = tuple(s.below(N_SUBJ) for _ in range(m))
            if not pairs & set(windows(sub)):
                break
        row[start : start + m] = torch.tensor(sub)
    return out


def _plan(s: Stream, n_layers: int, subjects, attrs, fact_layer: int, j: int, second: int, j2: int, k: int):
    """Per layer, the (prev1 part, tok part, attribute) of its attribute units, and the pairs of its
    scratch units. Every attribute unit reads its own pair: the facts' pairs at window j in the fact
    layer, k facts' pairs at window j2 in the secondary layer, unused subject-like pairs elsewhere."""
    true_pairs = {p for sub in subjects for p in windows(sub)}
    unused = [(a, b) for a in range(N_SUBJ) for b in range(N_SUBJ) if (a, b) not in true_pairs]
    unused = [unused[i] for i in s.permutation(len(unused))]
    attr_units: list[list[tuple[int, int, int]]] = []
    for layer in range(n_layers):
        units = []
        if layer == fact_layer:
            units = [(*windows(sub)[j], attrs[i]) for i, sub in enumerate(subjects)]
        elif layer == second:
            units = [(*windows(subjects[i])[j2], attrs[i]) for i in s.sample(N_FACTS, k)]
        while len(units) < N_ATTR_UNITS:
            units.append((*unused.pop(), s.below(N_ATTR)))
        attr_units.append(units)
    pool = sorted(true_pairs | {(a, b) for units in attr_units for a, b, _ in units})
    scr_units = []
    for units in attr_units:
        own = {(a, b) for a, b, _ in units}
        mine = [pair for pair in pool if pair not in own]
        scr_units.append([mine[i] for i in s.sample(len(mine), N_SCR_UNITS)])
    return attr_units, scr_units


def _and_unit(p: Planter, s: Stream, layer: int, first: int, second: int, attr: int | None) -> None:
    """An AND of two residual dims (jittered weights, a bias just below their sum) writing a row of
    norm drawn from NORM: into ``attr`` (a share ATTR_SHARE) and a dense scratch direction, or all scratch."""
    lay = p.lay
    w1, w2 = s.fraction(0.8, 1.25), s.fraction(0.8, 1.25)
    bias = -(w1 + w2) + s.fraction(0.4, 0.6)
    norm = s.fraction(*NORM)
    direction = s.normal(lay.dim("scr"))
    direction /= float(np.linalg.norm(direction))
    writes = []
    if attr is not None:
        gain = norm * s.fraction(*ATTR_SHARE)
        writes.append((lay.idx("attr", attr), gain))
        norm = (norm**2 - gain**2) ** 0.5
    writes += [(lay.idx("scr", i), float(norm * x)) for i, x in enumerate(direction)]
    p.mlp_unit(layer, [(first, w1), (second, w2)], bias, writes)


def _build(s: Stream, level: str, attr_units, scr_units):
    n_layers, n_ctx, _, noise, _ = LEVELS[level]
    lay = _layout(n_ctx)
    vocab = N_SUBJ + N_FILL + N_ATTR
    cfg = HookedConfig(n_layers=n_layers, n_heads=N_HEADS, d_model=lay.size + 4, d_head=16, d_vocab=vocab, n_ctx=n_ctx,
                       d_mlp=N_ATTR_UNITS + N_SCR_UNITS + N_FILL_UNITS, attn_only=False)  # fmt: skip
    p = Planter(cfg, lay)
    for t in range(vocab):
        p.W_E[t, lay.idx("tok", t)] = 1.0
        p.W_E[t, lay.idx("const")] = 1.0
    for i in range(n_ctx):
        p.W_pos[i, lay.idx("pos", i)] = 1.0
    for a in range(N_ATTR):
        p.W_U[lay.idx("out", a), N_SUBJ + N_FILL + a] = 1.0
    subj = list(range(N_SUBJ))
    heads = list(range(N_HEADS))
    h_prev1, h_prev2, h_read = heads[0], heads[1], heads[0]
    attend_offset(p, 0, h_prev1, 1, 9.0)
    copy_tokens(p, 0, h_prev1, subj, "prev1", 1.0, dst_offsets=subj)
    attend_offset(p, 0, h_prev2, 2, 9.0)
    copy_tokens(p, 0, h_prev2, subj, "prev2", 1.0, dst_offsets=subj)
    # the readout: uniform attention (no QK) at the last layer, attr -> out, gain n_ctx undoes the mean
    p.ov(n_layers - 1, h_read, [(lay.idx("attr", a), lay.idx("out", a), 4.0 * n_ctx) for a in range(N_ATTR)])
    for layer in range(n_layers):
        for head in range(N_HEADS):
            if (layer, head) in ((0, h_prev1), (0, h_prev2), (n_layers - 1, h_read)):
                continue
            distractor_job(p, s, layer, head, list(range(N_SUBJ, N_SUBJ + N_FILL)), ["flag0"], (0.5, 1.5),
                           (2.0, 5.0), n_tokens=(4, 8))  # fmt: skip
    for layer in range(n_layers):
        for a, b, attr in attr_units[layer]:
            _and_unit(p, s, layer, lay.idx("prev1", a), lay.idx("tok", b), attr)
        for a, b in scr_units[layer]:
            _and_unit(p, s, layer, lay.idx("prev1", a), lay.idx("tok", b), None)
        fill = [(a, b) for a in range(N_SUBJ) for b in range(N_SUBJ, N_SUBJ + N_FILL)]
        for i in s.sample(len(fill), N_FILL_UNITS):  # a filler after a subject part, into scratch
            _and_unit(p, s, layer, lay.idx("prev1", fill[i][0]), lay.idx("tok", fill[i][1]), None)
    return p.build(s, noise)


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    n_layers, n_ctx, lengths, _, given = LEVELS[level]
    # the truth first: the fact layer, the subject span and the storing window, before any rejection
    fact_layer = s.between(0, n_layers - 2)
    m = s.pick(lengths)
    start = s.between(1, n_ctx - 1 - m)  # the span ends by n_ctx - 2 (the last position reads out)
    j = s.below(m - 1)
    position = start + j + 1
    second = s.pick([x for x in range(n_layers - 1) if x != fact_layer])
    j2 = s.pick([x for x in range(m - 1) if x != j])
    k = s.between(*N_SECOND)
    while True:
        subjects = _subjects(s, m)
        attrs = [s.below(N_ATTR) for _ in subjects]
        attr_units, scr_units = _plan(s, n_layers, subjects, attrs, fact_layer, j, second, j2, k)
        model = _build(s, level, attr_units, scr_units)
        tokens = _prompts(s, subjects, start, n_ctx)
        targets = torch.tensor([N_SUBJ + N_FILL + a for a in attrs] * 2)
        pairs = {p for sub in subjects for p in windows(sub)}
        corrupt = replace_subjects(s, tokens, start, m, pairs)
        if metric(model, tokens, targets) < 2.0:
            continue
        ok = True
        # two independent subject replacements (the given one, and one an agent might draw)
        other = replace_subjects(s, tokens, start, m, pairs)
        for corrupted in (corrupt, other):
            rec = trace(model, tokens[:N_FACTS], corrupted[:N_FACTS], targets[:N_FACTS])
            peak = float(rec[fact_layer, position])
            rest = rec.clone()
            rest[fact_layer, position] = float("-inf")
            ok = ok and peak >= 0.5 and float(rest.max()) <= PEAK_MARGIN * peak
        if ok:
            break
    probe = {"tokens": tokens, "targets": targets}
    if given:
        probe["corrupted_tokens"] = corrupt
    return Instance(
        task_id=TASK_ID,
        level=level,
        seed=seed,
        family_version=VERSION,
        model=model,
        probe=probe,
        config={"kind": "hooked-transformer", **model.cfg.to_dict()},
        prompt=prompt.render(
            given,
            n_layers=n_layers,
            n_heads=N_HEADS,
            n_ctx=n_ctx,
            n_probe=tokens.shape[0],
            n_subj=N_SUBJ,
            first_attr=N_SUBJ + N_FILL,
            vocab=N_SUBJ + N_FILL + N_ATTR,
        ),
        answer_schema=answer_schema(level),
        truth={
            "kind": AnswerKind.CELL,
            "n_layers": n_layers,
            "n_positions": n_ctx,
            "layer": fact_layer,
            "position": position,
        },
    )
