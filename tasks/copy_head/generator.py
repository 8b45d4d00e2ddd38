"""Generator for copy-head: one head (in either layer) copies the single marked token to the output.

The marked token is the one token of a marked vocabulary subset in the sequence; its embedding
carries a "marked" feature, so the copy head finds it by content (a 1-layer model cannot find "the
token after a marker"). Every other head has a real job of the same shape. In each layer, 4-5 decoy
writers (tasks/decoys.py) have the copy head's QK and OV shapes -- attend to marked tokens, write the
identities of 6-10 tokens into the output subspace -- but copy plain tokens: what they read, they do
not copy. 5-6 more copy exactly the marked tokens into the output subspace, as the copy head does, but
attend to their own position (marked tokens never stand last) or to two token-subset flags of plain
tokens, so they read no token they copy. The remaining 0-3 heads have ordinary jobs:
positional heads (self, previous, offset 2), first-position heads and heads keyed on other token
subsets, each copying a few tokens into scratch space, and a few of them nudging the output logits.
Version 1 had no decoy writers: the copy head was the one head writing into the unembedding's space.
Version 4 (issue 20: generation time) is version 3's construction, accepted by the same rule read with the fast
:class:`~mechsandbox.tasks.circuits.QueryAblator`.
Version 5 (issue 16) adds *blind writers*: the copy head's QK and OV exactly -- attend to the mark, copy the marked
tokens into the output subspace -- except that the position whose logits are read (the last) attends away from the
mark, so there they write little; 5 in the copy head's layer and 6 in the other, so each layer holds SPECIAL heads
that read the mark and copy the marked tokens. In version 4 every decoy used the marked features on one side only,
so stripping the subspace the heads share most (the mark and the marked tokens) shrank both circuits of the copy
head alone, and a classifier on those stripped readings found it (0.50-0.84). Every head that attends by a flag
now reads its query from signed positions (one rank-1 QK of the same singular-value draw, ``attend_spread``); the
copy head's and the blind writers' signs are Hadamard rows (:func:`writer_signs`), so they differ in one
positional coefficient of the query, whether the last position attends: the circuit read against the data.
"""

from __future__ import annotations

import numpy as np
import torch

from ...answer_kind import AnswerKind
from ...arch import HookedConfig
from ..base import Instance
from ..circuits import (
    FAST_GUARD,
    Layout,
    Planter,
    QueryAblator,
    attend_spread,
    copy_tokens,
    distractor_job,
    hooked_instance,
    margin,
    permute_heads,
    single_head_ablations,
)
from ..decoys import plant_blind_writer, plant_flag_decoy, plant_offset_decoy
from ..rng import Stream
from ..schemas import head_schema
from . import prompt

TASK_ID = "copy-head"
VERSION = "5"
N_LAYERS, N_HEADS, D_HEAD, N_CTX = 2, 12, 16, 12
LEVELS = {"easy": (32, 0.0), "medium": (40, 0.01), "hard": (48, 0.02)}  # vocab, noise
N_FLAGS, N_SCR, N_PROBE = 4, 16, 96
READERS, COPIERS = (2, 3), (2, 3)  # decoys per layer: they read marked tokens / copy marked tokens
# A flag-reading head's query is CONST * const + sum_i sign_i pos[i] (attend_spread): positions whose sign is +1
# attend (score (1 + CONST) / |w| per unit of strength), those whose sign is -1 attend away ((CONST - 1) / |w|: a
# third of it, negative), so a blind writer leaks little at the last position. Singular value = per-query score *
# SPREAD for every such head.
CONST = 0.5
SPREAD = (CONST**2 + N_CTX) ** 0.5 / (1 + CONST)


def answer_schema(level: str) -> dict:
    return head_schema(N_LAYERS, N_HEADS, 1, "the copy head as [[layer, head]]")


def _layout(vocab: int) -> Layout:
    lay = Layout()
    for name, dim in (("tok", vocab), ("out", vocab), ("pos", N_CTX), ("const", 1), ("mark", 1), ("scr", N_SCR)):
        lay.add(name, dim)
    for f in range(N_FLAGS):
        lay.add(f"flag{f}", 1)
    return lay


def _probe(s: Stream, vocab: int, marked: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    plain = [t for t in range(vocab) if t not in marked]
    rows, targets = [], []
    for _ in range(N_PROBE):
        row = [plain[s.below(len(plain))] for _ in range(N_CTX)]
        m = marked[s.below(len(marked))]
        row[s.below(N_CTX - 1)] = m
        rows.append(row)
        targets.append(m)
    return torch.tensor(rows), torch.tensor(targets)


def _paley12() -> np.ndarray:
    """A Hadamard matrix of order 12 (Paley's construction from the squares mod 11): +-1 entries, H H^T = 12 I."""
    squares = {(i * i) % 11 for i in range(1, 11)}
    chi = [0] + [1 if a in squares else -1 for a in range(1, 11)]
    skew = np.zeros((12, 12))
    skew[0, 1:], skew[1:, 0] = 1.0, -1.0
    for i in range(11):
        for j in range(11):
            skew[1 + i, 1 + j] = chi[(j - i) % 11]
    return np.eye(12) + skew


HADAMARD = _paley12()
SPECIAL = 6  # per layer: the heads that attend to the mark and copy the marked tokens (copy head and blind writers)


def writer_signs(s: Stream) -> list[list[int]]:
    """Query signs (one per position) of the 2 * SPECIAL heads that read the mark and copy the marked tokens: the copy
    head first, then the blind writers. They are the rows of a Hadamard matrix of order N_CTX (rows and columns
    shuffled, columns flipped at random, rows flipped so that the last position's sign is +1 for the copy head and
    -1 for every blind writer), so any two of their queries have the same inner product (the const part) and the
    sum of their sign matrices' outer products is N_CTX I: no comparison of their query directions, no Gram
    matrix, no summed projector tells the copy head from a blind writer (a red team's odd-one-out reading scored
    0.87 / 0.84 / 0.70 when the other signs were random). Only which position a sign belongs to does: reading the
    query at the last position, the circuit against the data."""
    rows, cols = s.permutation(N_CTX), s.permutation(N_CTX)
    h = HADAMARD[np.ix_(rows, cols)] * np.array([1.0 if s.below(2) else -1.0 for _ in range(N_CTX)])[None, :]
    want = np.array([1.0] + [-1.0] * (2 * SPECIAL - 1))
    h = h * (want / h[:, -1])[:, None]
    return h.astype(int).tolist()


def query_signs(s: Stream, n: int) -> list[list[int]]:
    """Query signs of the other flag-reading heads (readers, flag copiers): random, every position's summing to 0 (or
    +-1) over them, so that no position, the last included, leans toward the copy head's sign or the blind writers'."""
    cols = []
    for _ in range(N_CTX):
        plus = set(s.sample(n, n // 2 + (s.below(2) if n % 2 else 0)))
        cols.append([1 if h in plus else -1 for h in range(n)])
    return [[col[h] for col in cols] for h in range(n)]


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    vocab, noise = LEVELS[level]
    lay = _layout(vocab)
    cfg = HookedConfig(
        n_layers=N_LAYERS, n_heads=N_HEADS, d_model=lay.size + 8, d_head=D_HEAD, d_vocab=vocab, n_ctx=N_CTX
    )
    copy_layer = s.below(N_LAYERS)  # drawn once: rejection below never re-draws it, so it stays uniform
    copy_head = 0  # the head index is made uniform by permute_heads after acceptance
    # Every scalar of the copy head and of its decoys (strengths, gains, how many tokens each copies, the
    # decoys' counts and kinds) is drawn once, here: acceptance (the decoys' noisy writes into the output
    # space lower hard's margins) would otherwise favour a strong copy head over its decoys.
    n_marked = s.between(6, 10)
    copy_job = (s.fraction(5.0, 6.0), s.fraction(2.5, 3.5))
    plans = []
    for _ in range(N_LAYERS):
        readers = [(n_marked, s.fraction(5.0, 6.0), s.fraction(2.5, 3.5)) for _ in range(s.between(*READERS))]
        copiers = []
        for _ in range(s.between(*COPIERS)):
            on_self = s.below(2) == 0
            copiers.append((on_self, s.fraction(4.0, 6.0) if on_self else s.fraction(5.0, 6.0), s.fraction(2.5, 3.5)))
        plans.append((readers, copiers))
    for layer in range(N_LAYERS):  # SPECIAL heads per layer read the mark and copy the marked tokens
        blind = [(s.fraction(5.0, 6.0), s.fraction(2.5, 3.5)) for _ in range(SPECIAL - (layer == copy_layer))]
        plans[layer] += (blind,)
    # the query signs, drawn here too: the copy head's and the blind writers' (in planting order), the others'
    special = writer_signs(s)
    signs = query_signs(s, sum(len(r) + sum(not on_self for on_self, _, _ in c) for r, c, _ in plans))
    while True:
        order = s.permutation(vocab)
        marked = sorted(order[:n_marked])
        plain = [t for t in range(vocab) if t not in marked]
        p = Planter(cfg, lay)
        p.embed_basics(out_gain=2.0)
        p.flag_tokens("mark", marked)
        flags = [f"flag{f}" for f in range(N_FLAGS)]
        for f in flags:  # each flag marks a random subset of the plain tokens (other heads' keys)
            p.flag_tokens(f, [t for t in plain if s.below(4) == 0])
        writers, queries = (iter([[(lay.idx("const"), CONST), *((lay.idx("pos", i), g) for i, g in enumerate(v))]
                                  for v in vs]) for vs in (special, signs))  # fmt: skip
        attend_spread(p, copy_layer, copy_head, next(writers), [lay.idx("mark")], copy_job[0] * SPREAD)
        copy_tokens(p, copy_layer, copy_head, marked, "out", copy_job[1])
        for layer, (readers, copiers, blind) in enumerate(plans):
            heads = [h for h in range(N_HEADS) if (layer, h) != (copy_layer, copy_head)]
            mark = [lay.idx("mark")]
            for i, head in enumerate(heads):
                if i < len(readers):  # the copy head's QK and OV shapes, copying plain tokens: reads marked only
                    n, strength, gain = readers[i]
                    toks = [plain[j] for j in s.sample(len(plain), n)]
                    plant_flag_decoy(p, layer, head, mark, strength * SPREAD, toks, "out", gain, query=next(queries))
                elif i < len(readers) + len(copiers):  # the copy head's OV, reading plain tokens only
                    on_self, strength, gain = copiers[i - len(readers)]
                    if on_self:  # at the last position it reads a plain token (marked ones never stand last)
                        plant_offset_decoy(p, layer, head, 0, strength, marked, "out", gain)
                    else:  # two token-subset flags of plain tokens: some key carries one in almost every sequence
                        keys = [lay.idx(flags[j]) for j in s.sample(N_FLAGS, 2)]
                        q = next(queries)
                        plant_flag_decoy(p, layer, head, keys, strength * SPREAD, marked, "out", gain, query=q)
                elif i < len(readers) + len(copiers) + len(blind):  # the copy head, but the last position is blind
                    strength, gain = blind[i - len(readers) - len(copiers)]
                    plant_blind_writer(p, layer, head, next(writers), mark, strength * SPREAD, marked, "out", gain)
                else:
                    distractor_job(p, s, layer, head, list(range(vocab)), flags, (2.5, 3.5), (4.0, 6.0))
                    if s.below(4) == 0:  # a few heads also nudge the logits of the tokens they copy
                        nudged = [plain[s.below(len(plain))] for _ in range(3)]
                        copy_tokens(p, layer, head, nudged, "out", s.fraction(0.3, 0.6))
        model = p.build(s, noise)
        tokens, targets = _probe(s, vocab, marked)
        # read with the fast ablator (the last position only), every bound tightened by FAST_GUARD
        ablator = QueryAblator(model, tokens, slice(-1, None))
        clean = margin(ablator.clean[:, -1], targets).mean().item()
        if clean < 2.0 + FAST_GUARD:  # (the decoys' noisy writes into the output lower hard's margins: skip ablating)
            continue
        after = single_head_ablations(model, tokens, lambda lg, t=targets: margin(lg[:, -1], t).mean().item(), ablator)
        drops = {head: clean - value for head, value in after.items()}
        top = drops[(copy_layer, copy_head)]
        rest = max(abs(v) for k, v in drops.items() if k != (copy_layer, copy_head))
        if top >= 0.6 * clean + FAST_GUARD and rest <= 0.2 * top - FAST_GUARD:
            break
    copy_head = permute_heads(model, s)[copy_layer][copy_head]
    return hooked_instance(
        TASK_ID,
        VERSION,
        seed,
        level,
        model,
        probe={"tokens": tokens, "targets": targets, "marked": marked},
        prompt=prompt.TEXT.format(n_layers=N_LAYERS, n_heads=N_HEADS, vocab=vocab, n_ctx=N_CTX, n_probe=N_PROBE),
        answer_schema=answer_schema(level),
        roles={(copy_layer, copy_head): "copy"},
        kind=AnswerKind.HEADS,
    )
