"""Generator for copy-head: one head (in either layer) copies the single marked token to the output.

The marked token is the one token of a marked vocabulary subset in the sequence; its embedding
carries a "marked" feature, so the copy head finds it by content (a 1-layer model cannot find "the
token after a marker"). Every other head has a real job of the same shape: positional heads (self,
previous, offset 2), first-position heads and heads keyed on other token subsets, each copying a few
tokens into scratch space, and a few of them nudging the output logits.
"""

from __future__ import annotations

import torch

from ...answer_kind import AnswerKind
from ...arch import HookedConfig
from ..base import Instance
from ..circuits import (
    Layout,
    Planter,
    attend_flag,
    copy_tokens,
    distractor_job,
    hooked_instance,
    margin,
    permute_heads,
    single_head_ablations,
)
from ..rng import Stream
from ..schemas import head_schema
from . import prompt

TASK_ID = "copy-head"
VERSION = "1"
N_LAYERS, N_HEADS, D_HEAD, N_CTX = 2, 12, 16, 12
LEVELS = {"easy": (32, 0.0), "medium": (40, 0.01), "hard": (48, 0.02)}  # vocab, noise
N_FLAGS, N_SCR, N_PROBE = 4, 16, 96


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


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    vocab, noise = LEVELS[level]
    lay = _layout(vocab)
    cfg = HookedConfig(
        n_layers=N_LAYERS, n_heads=N_HEADS, d_model=lay.size + 8, d_head=D_HEAD, d_vocab=vocab, n_ctx=N_CTX
    )
    copy_layer = s.below(N_LAYERS)  # drawn once: rejection below never re-draws it, so it stays uniform
    copy_head = 0  # the head index is made uniform by permute_heads after acceptance
    while True:
        order = s.permutation(vocab)
        marked = sorted(order[: s.between(6, 10)])
        plain = [t for t in range(vocab) if t not in marked]
        p = Planter(cfg, lay)
        p.embed_basics(out_gain=2.0)
        p.flag_tokens("mark", marked)
        flags = [f"flag{f}" for f in range(N_FLAGS)]
        for f in flags:  # each flag marks a random subset of the plain tokens (other heads' keys)
            p.flag_tokens(f, [t for t in plain if s.below(4) == 0])
        attend_flag(p, copy_layer, copy_head, lay.idx("mark"), s.fraction(5.0, 6.0))
        copy_tokens(p, copy_layer, copy_head, marked, "out", s.fraction(2.5, 3.5))
        for layer in range(N_LAYERS):
            for head in range(N_HEADS):
                if (layer, head) == (copy_layer, copy_head):
                    continue
                distractor_job(p, s, layer, head, list(range(vocab)), flags, (2.5, 3.5), (4.0, 6.0))
                if s.below(4) == 0:  # a few heads also nudge the logits of the tokens they copy
                    copy_tokens(
                        p, layer, head, [plain[s.below(len(plain))] for _ in range(3)], "out", s.fraction(0.3, 0.6)
                    )
        model = p.build(s, noise)
        tokens, targets = _probe(s, vocab, marked)
        with torch.no_grad():
            clean = margin(model(tokens)[:, -1], targets).mean().item()
        after = single_head_ablations(model, tokens, lambda lg, t=targets: margin(lg[:, -1], t).mean().item())
        drops = {head: clean - value for head, value in after.items()}
        top = drops[(copy_layer, copy_head)]
        rest = max(abs(v) for k, v in drops.items() if k != (copy_layer, copy_head))
        if clean >= 2.0 and top >= 0.6 * clean and rest <= 0.2 * top:
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
