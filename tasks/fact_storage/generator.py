"""Generator for fact-storage: subject -> attribute facts stored in one layer's MLP at the last
subject token (ROME-style), found by causal tracing.

Construction, in a named basis that ``Planter.build`` then rotates:
- vocabulary: subject-part tokens, filler/relation tokens, attribute tokens. A subject is a tuple of
  2 or 3 subject-part tokens; parts are shared between subjects, so no single token names a subject.
- layer 0: a previous-token head and an offset-2 head copy the earlier subject parts into ``prev1`` and
  ``prev2`` at each position, so the last subject token holds the whole subject.
- every MLP layer has "subject detector" units (an AND of tok, prev1, prev2 through the ReLU threshold).
  In the *fact layer* they write the subject's attribute into ``attr`` (a share rho of it), in one
  *secondary* layer the rest (1 - rho); in every other layer detectors of the same kind write only into
  scratch space, as do filler-pattern units, so activations alone do not reveal the fact layer.
- the last layer's readout head attends uniformly and copies ``attr`` to ``out``, which the
  unembedding reads as attribute logits at the last position.
Corruption is subject-token replacement (symmetric token replacement; Gaussian noise on the subject's
embeddings is unreliable here, as in trained models: it also writes straight into the directions the
readout copies; see Zhang & Nanda 2023). Restoring the fact layer's MLP output at the last subject
token in a corrupted run brings back the share rho of the clean logit difference; the secondary
layer (1 - rho); every other cell nothing.
Restoring the *residual* at that position plateaus at full recovery for every layer up to the fact
layer, which is why the answer is defined on MLP outputs. The generator checks the trace with a margin.
"""

from __future__ import annotations

import torch

from ...answer_kind import AnswerKind
from ...arch import HookedConfig, HookedTransformer
from ..base import Instance
from ..circuits import Layout, Planter, attend_offset, copy_tokens, distractor_job
from ..rng import Stream
from . import prompt

TASK_ID = "fact-storage"
VERSION = "1"
N_SUBJ, N_FILL, N_ATTR = 14, 8, 8
N_FACTS = 24
N_HEADS = 4
LEVELS = {  # n_layers, n_ctx, subject-end positions (lo, hi), noise, corrupted prompts given
    "easy": (6, 10, (4, 8), 0.0, True),
    "medium": (6, 11, (4, 9), 0.01, False),
    "hard": (7, 12, (4, 10), 0.02, False),
}
RHO = (0.62, 0.75)  # the fact layer's share of the attribute write
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


def _subjects(s: Stream, m: int) -> list[tuple[int, ...]]:
    """N_FACTS distinct subject tuples of m parts; every last part is shared by >= 2 subjects."""
    while True:
        subjects = {tuple(s.below(N_SUBJ) for _ in range(m)) for _ in range(N_FACTS * 3)}
        ordered = sorted(subjects)
        picked = [ordered[i] for i in s.sample(len(ordered), min(N_FACTS, len(ordered)))]
        lasts = [sub[-1] for sub in picked]
        if len(picked) == N_FACTS and all(lasts.count(x) >= 2 for x in lasts):
            return picked


def _prompts(s: Stream, subjects: list[tuple[int, ...]], end: int, n_ctx: int) -> torch.Tensor:
    m = len(subjects[0])
    rows = []
    for _ in range(2):
        for sub in subjects:
            fill = [N_SUBJ + s.below(N_FILL) for _ in range(n_ctx)]
            fill[end - m + 1 : end + 1] = list(sub)
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
    All positions of a layer run as one forward pass over the repeated batch."""
    n, n_ctx = clean.shape
    names = [f"blocks.{lay}.hook_{site}" for lay in range(model.cfg.n_layers)]
    with torch.no_grad():
        logits, cache = model.run_with_cache(clean, names_filter=lambda name: name in names)
        m_clean = metric(model, clean, targets, logits)
        m_corrupt = metric(model, corrupt, targets)
    batch, many_targets = corrupt.repeat(n_ctx, 1), targets.repeat(n_ctx)
    out = torch.zeros(model.cfg.n_layers, n_ctx)
    for lay, name in enumerate(names):

        def restore(act, hook, name=name):
            for pos in range(n_ctx):
                act[pos * n : (pos + 1) * n, pos] = cache[name][:, pos]
            return act

        with torch.no_grad():
            logits = model.run_with_hooks(batch, fwd_hooks=[(name, restore)])
        for pos in range(n_ctx):
            rows = slice(pos * n, (pos + 1) * n)
            m = metric(model, batch[rows], many_targets[rows], logits[rows])
            out[lay, pos] = (m - m_corrupt) / (m_clean - m_corrupt)
    return out


def replace_subjects(s: Stream, tokens: torch.Tensor, end: int, m: int, facts: set[tuple[int, ...]]) -> torch.Tensor:
    """Token corruption: each prompt's subject replaced by random subject parts that name no fact."""
    out = tokens.clone()
    for row in out:
        while True:
            sub = tuple(s.below(N_SUBJ) for _ in range(m))
            if sub not in facts:
                break
        row[end - m + 1 : end + 1] = torch.tensor(sub)
    return out


def _build(s: Stream, level: str, subjects, attrs, fact_layer: int, second: int, rho: float):
    n_layers, n_ctx, _, noise, _ = LEVELS[level]
    lay = _layout(n_ctx)
    vocab = N_SUBJ + N_FILL + N_ATTR
    cfg = HookedConfig(n_layers=n_layers, n_heads=N_HEADS, d_model=lay.size + 4, d_head=16, d_vocab=vocab,
                       n_ctx=n_ctx, d_mlp=2 * N_FACTS, attn_only=False)  # fmt: skip
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
    m = len(subjects[0])
    scr = lay.dim("scr")
    for layer in range(n_layers):
        # every layer detects subject-like tuples; only the fact layers write the attribute. Every unit
        # writes with a gain drawn like the fact layer's (2 x a share in RHO), so W_out norms match.
        share = rho if layer == fact_layer else (1.0 - rho) if layer == second else 0.0
        tuples = subjects if share else [tuple(s.below(N_SUBJ) for _ in range(m)) for _ in range(N_FACTS)]
        for i, sub in enumerate(tuples):
            reads = [(lay.idx("tok", sub[-1]), 1.0), (lay.idx("prev1", sub[-2]), 1.0)]
            if m == 3:
                reads.append((lay.idx("prev2", sub[-3]), 1.0))
            gain = 2.0 * (rho if share else s.fraction(*RHO))
            writes = [(lay.idx("attr", attrs[i]), 2.0 * share)] if share else []
            rest = gain**2 - (2.0 * share) ** 2
            if rest > 1e-9:
                writes.append((lay.idx("scr", s.below(scr)), rest**0.5))
            p.mlp_unit(layer, reads, -(m - 0.5), writes)
        for _ in range(N_FACTS):  # filler-pattern units: a filler token after a subject part, into scratch
            a, b = N_SUBJ + s.below(N_FILL), s.below(N_SUBJ)
            p.mlp_unit(layer, [(lay.idx("tok", a), 1.0), (lay.idx("prev1", b), 1.0)], -1.5,
                       [(lay.idx("scr", s.below(scr)), 2.0 * s.fraction(*RHO))])  # fmt: skip
    return p.build(s, noise)


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    n_layers, n_ctx, (e_lo, e_hi), _, given = LEVELS[level]
    fact_layer = s.between(1, n_layers - 2)
    end = s.between(e_lo, e_hi)
    m = s.pick((2, 3)) if end >= 3 else 2
    while True:
        second = s.pick([x for x in range(1, n_layers - 1) if x != fact_layer])
        rho = s.fraction(*RHO)
        subjects = _subjects(s, m)
        attrs = [s.below(N_ATTR) for _ in subjects]
        model = _build(s, level, subjects, attrs, fact_layer, second, rho)
        tokens = _prompts(s, subjects, end, n_ctx)
        targets = torch.tensor([N_SUBJ + N_FILL + a for a in attrs] * 2)
        corrupt = replace_subjects(s, tokens, end, m, set(subjects))
        if metric(model, tokens, targets) < 2.0:
            continue
        ok = True
        # two independent subject replacements (the given one, and one an agent might draw)
        other = replace_subjects(s, tokens, end, m, set(subjects))
        for corrupted in (corrupt, other):
            rec = trace(model, tokens[:N_FACTS], corrupted[:N_FACTS], targets[:N_FACTS])
            peak = float(rec[fact_layer, end])
            rest = rec.clone()
            rest[fact_layer, end] = float("-inf")
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
            "position": end,
        },
    )
