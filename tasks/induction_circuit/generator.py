"""Generator for induction-circuit: a previous-token head (layer 0) K-composes with an induction
head (layer 1) on repeated random sequences ``[... A B ... A] -> B``.

The previous-token head copies each token's identity into a "previous token" subspace of the next
position; the induction head's keys read that subspace and its queries read the current token, so it
attends to the position after the earlier occurrence and copies that token to the output.
Distractors in both layers have confusable jobs: another previous-token head and a duplicate-token
head in either layer, fixed-offset, self and attend-to-first heads, all writing to scratch space
with the same full-vocabulary copy maps as the planted heads.

Version 4 adds decoys for the composed readings of the weights (issue 16: only the induction head wrote what the
unembedding reads, and only the previous-token head's write was read by a later key, so ``W_V W_O W_U`` named one
and the K-composition norm the other):

- out-writers: layer-1 heads that copy the full vocabulary into ``out`` at the induction head's gain, attending
  uniformly to the first half of the sequence (a constant query against the first half's positions). On a
  repeated sequence that adds the same logit to the eight tokens of the sequence, the target among them, so the
  margin barely moves.
- key readers: the previous-token head's write is read by the induction head and by an induction-like decoy that
  writes into scratch; two scratch writers' maps are read by other layer-1 keys (the scratch writers share those
  slots, so these read them all). Composition *norms* (Elhage et al.) then tie the previous-token head with the
  scratch writers and the induction head with the decoy readers.

This closes every single composed reading of the version-3 audit (composed 0.47 -> 0.20-0.24), but not the
class: a red team read the circuit from the weights alone (0.99) by the token-aligned K-composition (the
previous-token head has two aligned readers, each decoy-read scratch writer one) and by the out-writers' positional
keys (W_E QK W_pos^T, zero for the induction head). The audit now has both readings and lists the family as an
open finding (tests/test_shortcut_audit.py, OPEN; docs/TASKS.md).
"""

from __future__ import annotations

import torch

from ...arch import HookedConfig
from ..base import Instance
from ..circuits import (
    Layout,
    Planter,
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
VERSION = "4"
ROLES = ("previous-token", "induction")
N_LAYERS, HALF, N_PROBE = 2, 8, 64
N_CTX = 2 * HALF
LEVELS = {"easy": (24, 10, 0.0), "medium": (28, 10, 0.01), "hard": (32, 12, 0.02)}  # vocab, heads/layer, noise
N_FLAGS = 3
READERS = 2  # layer-1 heads whose keys read each layer-0 head's write (the induction head is one of the two)
# layer-1 out-writers per level: hard's weight noise, carried to the logits through their gains, costs about 0.5 of
# the margin per writer, so hard has fewer
WRITERS = {"easy": 3, "medium": 3, "hard": 2}
# the clean induction margin an instance needs (version 4: hard's noise through the out-writers costs margin)
MIN_MARGIN = {"easy": 2.0, "medium": 2.0, "hard": 1.5}
QK_MAX, OV_MAX = 9.0, 3.5  # the largest planted score strength and copy gain (bounds of the spectral targets)


def answer_schema(level: str) -> dict:
    return head_schema(N_LAYERS, LEVELS[level][1], 2, "the circuit's heads, optionally with role labels", roles=ROLES)


def _layout(vocab: int) -> Layout:
    lay = Layout()
    # pad: read by the spectral padding, written by nothing; sink: written by the OV padding, read by nothing
    for name, dim in (("tok", vocab), ("prev", vocab), ("out", vocab), ("scr", vocab), ("pos", N_CTX), ("const", 1),
                      ("pad", vocab), ("sink", vocab)):  # fmt: skip
        lay.add(name, dim)
    for f in range(N_FLAGS):
        lay.add(f"flag{f}", 1)
    return lay


def _probe(s: Stream, vocab: int) -> torch.Tensor:
    rows = []
    for _ in range(N_PROBE):
        first = s.sample(vocab, HALF)
        rows.append(first + first)
    return torch.tensor(rows)


def _plant_out_writer(p: Planter, s: Stream, head: int, toks: list[int], gain: float) -> None:
    """A layer-1 decoy that copies the full vocabulary into ``out`` at the induction head's gain while attending
    uniformly to the first half (a constant query against each first-half position): on the probe's repeated
    sequences it raises the eight tokens of the sequence alike. Its QK is rank 1 with singular value
    st * sqrt(HALF), kept under the layer's spectral bound (QK_MAX); st near 3 still puts about 97% of the
    attention on the first half."""
    st = s.fraction(2.6, 3.0)
    p.qk(1, head, [(p.lay.idx("const"), p.lay.idx("pos", j), st) for j in range(HALF)])
    copy_tokens(p, 1, head, toks, "out", gain)


def _read_keys(p: Planter, s: Stream, head: int, write: dict[int, tuple[int, float]]) -> None:
    """A layer-1 head's QK that reads what a layer-0 head writes (``write``: token dim -> (written dim, gain), as
    ``copy_map`` gives it): the query reads the token, the key the written copy, each gain divided out again. The
    induction head and its key-reader decoys are planted by this one rule."""
    base = s.fraction(6.0, 7.0)
    p.qk(1, head, [(src, dst, base / gain) for src, (dst, gain) in sorted(write.items())])


def _plant_key_reader(p: Planter, s: Stream, head: int, write: dict[int, tuple[int, float]]) -> None:
    """A layer-1 decoy whose keys read what a layer-0 head writes (:func:`_read_keys`) and which copies the
    vocabulary into scratch."""
    _read_keys(p, s, head, write)
    toks = list(range(p.cfg.d_vocab))
    copy_tokens(p, 1, head, toks, "scr", s.fraction(0.9, 3.5), s.sample(p.lay.dim("scr"), len(toks)))


def induction_margin(model, tokens: torch.Tensor, logits: torch.Tensor | None = None) -> float:
    """Mean margin of the next-token prediction over the repeated half (positions HALF..N_CTX-2)."""
    if logits is None:
        with torch.no_grad():
            logits = model(tokens)
    return margin(logits[:, HALF:-1], tokens[:, HALF + 1 :]).mean().item()


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    vocab, n_heads, noise = LEVELS[level]
    lay = _layout(vocab)
    cfg = HookedConfig(
        n_layers=N_LAYERS, n_heads=n_heads, d_model=lay.size + 8, d_head=vocab, d_vocab=vocab, n_ctx=N_CTX
    )
    toks = list(range(vocab))
    flags = [f"flag{f}" for f in range(N_FLAGS)]
    prev_head, ind_head = 0, 0  # head indices are made uniform by permute_heads after acceptance
    dh = cfg.d_head
    # one QK and one OV singular-value profile per layer, from constants only (see circuits.pad_spectrum)
    targets = [(spectral_target(s, QK_MAX * dh**0.5, dh), spectral_target(s, OV_MAX, dh)) for _ in range(N_LAYERS)]
    while True:
        p = Planter(cfg, lay)
        p.embed_basics(out_gain=2.0)
        for f in flags:
            p.flag_tokens(f, [t for t in toks if s.below(4) == 0])
        attend_offset(p, 0, prev_head, 1, s.fraction(5.0, 6.0))
        prev_gain = s.fraction(1.0, 3.0)  # the induction head's keys divide it out again
        copy_tokens(p, 0, prev_head, toks, "prev", prev_gain)
        prev_write = copy_map(p, 0, prev_head)
        _read_keys(p, s, ind_head, prev_write)
        out_gain = s.fraction(2.5, 3.5)  # one draw for every out-writer: acceptance cannot select one gain over another
        copy_tokens(p, 1, ind_head, toks, "out", out_gain)
        for head in range(1, n_heads):
            distractor_job(p, s, 0, head, toks, flags, (0.9, 3.5), (4.0, 9.0), offsets=(0, 1, 2, 3),
                           n_tokens=(vocab, vocab), duplicate=True)  # fmt: skip
        layer1 = iter(range(1, n_heads))
        for head in [next(layer1) for _ in range(WRITERS[level])]:
            _plant_out_writer(p, s, head, toks, out_gain)
        for head in [next(layer1) for _ in range(READERS - 1)]:  # the induction head is the first such reader
            _plant_key_reader(p, s, head, prev_write)
        for head, writer in zip([next(layer1) for _ in range(READERS)], s.sample(n_heads - 1, READERS), strict=True):
            _plant_key_reader(p, s, head, copy_map(p, 0, 1 + writer))
        for head in layer1:
            distractor_job(p, s, 1, head, toks, flags, (0.9, 3.5), (4.0, 9.0), offsets=(0, 1, 2, 3),
                           n_tokens=(vocab, vocab), duplicate=True)  # fmt: skip
        for layer in range(N_LAYERS):  # every head of a layer: the same QK and the same OV spectrum
            for head in range(n_heads):
                pad_spectrum(p, s, layer, head, "qk", targets[layer][0], "pad")
                pad_spectrum(p, s, layer, head, "ov", targets[layer][1], "pad", "sink")
        model = p.build(s, noise)
        tokens = _probe(s, vocab)
        clean = induction_margin(model, tokens)
        if clean < MIN_MARGIN[level]:  # rejected whatever the ablations say (they draw nothing): skip them
            continue
        after = single_head_ablations(model, tokens, lambda lg, m=model, t=tokens: induction_margin(m, t, lg))
        drops = {head: clean - value for head, value in after.items()}
        low = min(drops[(0, prev_head)], drops[(1, ind_head)])
        rest = max(abs(v) for k, v in drops.items() if k not in ((0, prev_head), (1, ind_head)))
        if low >= 0.5 * clean and rest <= 0.25 * low:
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
