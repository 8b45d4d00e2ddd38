"""Generator for induction-circuit: a previous-token head (layer 0) K-composes with an induction
head (layer 1) on repeated random sequences ``[... A B ... A] -> B``.

The previous-token head copies each token's identity into the position after it; the induction head's keys read
that write and its queries read the current token, so it attends to the position after the earlier occurrence and
copies that token to the output. Distractors in layer 0 have confusable jobs (offset, self, attend-to-first,
duplicate-token, flag and pairing heads), each copying the vocabulary as the previous-token head does.

Version 5 makes the composed readings of the weights tie the circuit with decoys that the data leaves inert
(issue 16: version 4's decoys fooled single readings, but the token-aligned K-composition counted two readers of
the previous-token head against one of each scratch writer, and the out-writers' keys read positions where the
induction head's did not):

- every layer-0 head writes into a private space, and layer-1 head h's keys read, token by token, layer-0 head h's
  write and nothing else (a perfect matching: a wiring where each key read two writes let the read graph alone
  halve the candidates, and readers of one write against readers of several showed in the composition norms):
  counts, traces and composition norms are alike for every head of a layer;
- echo heads: ``WRITERS`` layer-1 heads built like the induction head (keys read one layer-0 head's write,
  token-aligned; the vocabulary copied into ``out`` at the induction head's gain), except that the head they read
  attends to the first position, so its write is the first token at every position and the echo's keys all
  match or all miss alike: on the probe's sequences an echo spreads over the first half and raises the
  sequence's eight tokens together; decoy previous-token heads (the real one's rule and strengths; two in version
  5, four from version 8) are read by scratch readers;
- every layer-1 head has the same kind of positional key term (a bias towards the first half, where the induction
  target always lies), so no cross term of token queries and positional keys tells them apart.

What still separates the induction head from its echoes in the weights is which layer-0 head each one reads, and
what that head attends to: the circuit itself, read across two layers. docs/TASKS.md says so.
Version 6 (issue 20: generation time) is version 5's construction, accepted by the same rule read with the fast
:class:`~mechsandbox.tasks.circuits.QueryAblator` (:func:`_accepted`).
Version 7 is version 6's construction with ``circuits.canonical_svd`` in the spectral padding: version 6 built the pad
from whatever basis LAPACK returned for equal singular values, so its weights, and under hard's noise its accepted
draw, differed between machines (tests/test_platform_independence.py).
Version 8 (issue 16, the audit's cross-head overlaps): four decoy previous-token heads instead of two. Heads planted
with one rule share their planted entries, so the normalised Frobenius overlaps of their QK circuits find the
offset-1 heads as a cluster (the positional reading W_pos QK W_pos^T finds them too), and the out-writers' OVs
(one copy map, one gain) form another: with two decoys a learned reading of those overlaps picked the circuit at
0.351 at hard (the true head 1 of 3 offset-1 heads, the induction head 1 of 4 out-writers, plus what weak
per-head differences add). With four, the previous-token head is 1 of 5: 0.228 at hard. More echoes would do the
same for the induction head but dilute its margin (four echoes: hard's median build 2.1 s against 0.45 s).
And one copy gain for every layer-0 head (one draw per head before): a layer-1 key divides its source's gain out
(``_read_keys``), so the stripped spectra of a reader's QK and its writer's OV multiplied to the key strength,
from a narrow range, for true pairs only; a red team (2026-12-04) matched every reader to its writer by that
product alone and named the circuit at 0.35-0.39 on version 8 as first built."""

from __future__ import annotations

import numpy as np
import torch

from ...arch import HookedConfig
from ..base import Instance
from ..circuits import (
    FAST_GUARD,
    Layout,
    Planter,
    QueryAblator,
    attend_flag,
    attend_offset,
    copy_map,
    copy_tokens,
    distractor_job,
    hooked_instance,
    margin,
    pad_spectrum,
    permute_heads,
    single_head_ablations,
    spectral_target,
)
from ..rng import Stream
from ..schemas import head_schema
from . import prompt

TASK_ID = "induction-circuit"
VERSION = "8"
ROLES = ("previous-token", "induction")
N_LAYERS, HALF, N_PROBE = 2, 8, 64
N_CTX = 2 * HALF
LEVELS = {"easy": (24, 10, 0.0), "medium": (28, 10, 0.01), "hard": (32, 12, 0.014)}  # vocab, heads/layer, noise
N_FLAGS = 3
READERS = 1  # layer-1 keys that read each layer-0 head's write, token by token (and writes each layer-1 key reads)
# echo heads: with the induction head, 4 out-writers, so one guessed (out-writer, its source) pair is right 1 time in
# 4 and the union of all of them has Jaccard 2/8 (with 2 echoes hard's union scored 0.33 in a red team's test)
WRITERS = 3
PREV_DECOYS = 4  # other layer-0 previous-token heads, planted like the real one, read by scratch readers (v7: 2)
MIN_MARGIN = {"easy": 2.0, "medium": 2.0, "hard": 1.5}  # the clean induction margin an instance needs
QK_MAX, OV_MAX = 9.0, 3.5  # the largest planted score strength and copy gain (bounds of the spectral targets)
GAIN = (1.5, 3.5)  # the layer-0 copy gain: one draw for every layer-0 head (version 8; before, one draw per head)
BASE = (6.0, 7.0)  # the score one token-aligned key read adds
FIRST_HALF = (2.6, 3.0)  # every layer-1 key's bias towards the first half


def answer_schema(level: str) -> dict:
    return head_schema(N_LAYERS, LEVELS[level][1], 2, "the circuit's heads, optionally with role labels", roles=ROLES)


def _layout(vocab: int, n_heads: int) -> Layout:
    lay = Layout()
    dh = vocab + 1  # the vocabulary-wide key read plus one dimension for the first-half bias
    # w{h}: layer-0 head h's private write; scr: layer-1 scratch, read by nothing; pad: read by the spectral
    # padding, written by nothing; sink: written by the OV padding, read by nothing
    for name, dim in (("tok", vocab), ("out", vocab), ("scr", vocab), ("pos", N_CTX), ("const", 1), ("pad", dh),
                      ("sink", dh)):  # fmt: skip
        lay.add(name, dim)
    for h in range(n_heads):
        lay.add(f"w{h}", vocab)
    for f in range(N_FLAGS):
        lay.add(f"flag{f}", 1)
    return lay


def _probe(s: Stream, vocab: int) -> torch.Tensor:
    rows = []
    for _ in range(N_PROBE):
        first = s.sample(vocab, HALF)
        rows.append(first + first)
    return torch.tensor(rows)


def _read_keys(p: Planter, s: Stream, head: int, src: int) -> None:
    """Layer-1 head ``head``'s QK: the query reads the current token and the key reads that token's copy in
    layer-0 head ``src``'s write (``copy_map``, its gain divided out again), one head dimension per token; one more
    dimension gives the key a bias towards the first half (the query's constant feature against the first HALF
    positions). The induction head, its echoes and the scratch readers are all planted by this rule, so their QKs
    differ only in which write they read and in drawn strengths."""
    scale = np.sqrt(np.sqrt(p.cfg.d_head))  # as Planter.qk: the head's scores gain the strengths exactly
    wq, wk = p.W_Q[1, head], p.W_K[1, head]
    base = s.fraction(*BASE)
    for dim_in, (dim_out, gain) in copy_map(p, 0, src).items():
        e = dim_in - p.lay.idx("tok")
        wq[dim_in, e] = scale
        wk[dim_out, e] = scale * base / gain
    root = np.sqrt(s.fraction(*FIRST_HALF)) * scale
    e = p.cfg.d_vocab
    wq[p.lay.idx("const"), e] = root
    for j in range(HALF):
        wk[p.lay.idx("pos", j), e] = root


def _write_private(p: Planter, s: Stream, head: int, gain: float) -> None:
    """Layer-0 head ``head`` copies the whole vocabulary into its private space ``w{head}`` (random slots)."""
    vocab = p.cfg.d_vocab
    copy_tokens(p, 0, head, list(range(vocab)), f"w{head}", gain, s.sample(vocab, vocab))


def induction_margin(model, tokens: torch.Tensor, logits: torch.Tensor | None = None) -> float:
    """Mean margin of the next-token prediction over the repeated half (positions HALF..N_CTX-2)."""
    if logits is None:
        with torch.no_grad():
            logits = model(tokens)
    return margin(logits[:, HALF:-1], tokens[:, HALF + 1 :]).mean().item()


def _accepted(model, tokens: torch.Tensor, min_margin: float, prev: tuple, ind: tuple) -> bool:
    """The circuit's ablation properties (docs/TASKS.md): a clean margin of at least ``min_margin``, each planted
    head's ablation costs at least half of it, and no other head's more than a quarter of the smaller of the two.
    Read with the fast :class:`QueryAblator` (the repeated half's queries only), every bound tightened by
    ``FAST_GUARD``, so what passes here passes the exact ablations the tests read."""
    ablator = QueryAblator(model, tokens, slice(HALF, N_CTX - 1))

    def mean_margin(logits: torch.Tensor) -> float:
        return margin(logits, tokens[:, HALF + 1 :]).mean().item()

    clean = mean_margin(ablator.clean)
    if clean < min_margin + FAST_GUARD:  # rejected whatever the ablations say (they draw nothing): skip them
        return False
    drops = {head: clean - m for head, m in single_head_ablations(model, tokens, mean_margin, ablator).items()}
    low = min(drops[prev], drops[ind])
    rest = max(abs(v) for k, v in drops.items() if k not in (prev, ind))
    return low >= 0.5 * clean + FAST_GUARD and rest <= 0.25 * low - FAST_GUARD


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    vocab, n_heads, noise = LEVELS[level]
    lay = _layout(vocab, n_heads)
    dh = vocab + 1
    cfg = HookedConfig(n_layers=N_LAYERS, n_heads=n_heads, d_model=lay.size + 8, d_head=dh, d_vocab=vocab, n_ctx=N_CTX)
    toks = list(range(vocab))
    flags = [f"flag{f}" for f in range(N_FLAGS)]
    prev_head, ind_head = 0, 0  # head indices are made uniform by permute_heads after acceptance
    # one QK and one OV singular-value profile per layer, from constants only (see circuits.pad_spectrum)
    targets = [(spectral_target(s, QK_MAX * dh**0.5, dh), spectral_target(s, OV_MAX, dh)) for _ in range(N_LAYERS)]
    while True:
        p = Planter(cfg, lay)
        p.embed_basics(out_gain=2.0)
        for f in flags:
            p.flag_tokens(f, [t for t in toks if s.below(4) == 0])
        # layer 0: the previous-token head, the heads the echoes read (attend to the first position: the first
        # token is written everywhere), the decoy previous-token heads, then distractors; one copy gain for all
        # (a reader's key divides its source's gain out, so per-head gains paired readers with writers: see above)
        gain0 = s.fraction(*GAIN)
        for head in range(1 + WRITERS + PREV_DECOYS):
            if 1 <= head <= WRITERS:
                attend_flag(p, 0, head, lay.idx("pos", 0), s.fraction(4.0, 9.0))
            else:
                attend_offset(p, 0, head, 1, s.fraction(5.0, 6.0))
            _write_private(p, s, head, gain0)
        for head in range(1 + WRITERS + PREV_DECOYS, n_heads):
            distractor_job(p, s, 0, head, toks, flags, (gain0, gain0), (4.0, 9.0), offsets=(0, 1, 2, 3),
                           n_tokens=(vocab, vocab), duplicate=True, dst=f"w{head}")  # fmt: skip
        out_gain = s.fraction(2.5, 3.5)  # one draw for the induction head and its echoes
        for head in range(n_heads):  # layer-1 head h reads layer-0 head h: induction, echoes, then scratch readers
            _read_keys(p, s, head, head)
            if head <= WRITERS:
                copy_tokens(p, 1, head, toks, "out", out_gain)
            else:
                copy_tokens(p, 1, head, toks, "scr", s.fraction(0.9, 3.5), s.sample(vocab, vocab))
        for layer in range(N_LAYERS):  # every head of a layer: the same QK and the same OV spectrum
            for head in range(n_heads):
                pad_spectrum(p, s, layer, head, "qk", targets[layer][0], "pad")
                pad_spectrum(p, s, layer, head, "ov", targets[layer][1], "pad", "sink")
        model = p.build(s, noise)
        tokens = _probe(s, vocab)
        if _accepted(model, tokens, MIN_MARGIN[level], (0, prev_head), (1, ind_head)):
            break
    new_of = permute_heads(model, s)
    prev_head, ind_head = new_of[0][prev_head], new_of[1][ind_head]
    return hooked_instance(
        TASK_ID,
        VERSION,
        seed,
        level,
        model,
        probe={"tokens": tokens},
        prompt=prompt.TEXT.format(
            n_layers=N_LAYERS, n_heads=n_heads, vocab=vocab, n_ctx=N_CTX, n_probe=N_PROBE, half=HALF, last=N_CTX - 2
        ),
        answer_schema=answer_schema(level),
        roles={(0, prev_head): "previous-token", (1, ind_head): "induction"},
    )
