"""Generator for head-roles: a 2-layer attention-only transformer whose every head has a role
defined by an attention-pattern detection score on the probe set (TransformerLens ``detect_head``
style), at head positions that vary by seed.

Roles and their scores (mean attention, over probe sequences of ``HALF`` random tokens repeated twice):
- previous-token: on position i - 1 (positions i >= 1);
- duplicate-token: on the earlier copy of the current token, i - HALF (second-half positions);
- induction: on the token after that copy, i - HALF + 1 (second-half positions; layer 1 only, via
  K-composition with a layer-0 head that copies the previous token);
- attend-to-first: on position 0 (positions i >= 1);
- local: on positions i - 2 and i - 3 together (positions i >= 3);
- none: every score below the threshold (content heads that attend to a token subset).
A head's role is the role whose score reaches THRESHOLD (at most one can); otherwise "none". Each
layer's role multiset contains every role its layer can hold plus extra draws, so some role always
appears twice in a layer (a redundant pair). The generator checks every head's scores with a margin.
"""

from __future__ import annotations

import torch

from ...answer_kind import AnswerKind
from ...arch import HookedConfig, HookedTransformer
from ..base import Instance
from ..circuits import (
    Layout,
    Planter,
    attend_flag,
    attend_offset,
    copy_tokens,
    pad_spectrum,
    permute_heads,
    spectral_target,
)
from ..rng import Stream
from . import prompt

TASK_ID = "head-roles"
VERSION = "2"
ROLES = ("previous-token", "duplicate-token", "induction", "attend-to-first", "local", "none")
LAYER0 = ("previous-token", "duplicate-token", "attend-to-first", "local", "none")
HALF, N_PROBE, N_LAYERS = 8, 64, 2
N_CTX = 2 * HALF
LEVELS = {"easy": (24, 8, 0.0), "medium": (28, 9, 0.01), "hard": (32, 10, 0.02)}  # vocab, heads/layer, noise
THRESHOLD = 0.4  # stated in the prompt
PLANTED_MIN, OTHER_MAX = 0.55, 0.25  # enforced by the generator
N_FLAGS = 3
PAD_EXTRA = 8  # head dims beyond the largest planted job
QK_MAX, OV_MAX = 8.0, 2.0  # the largest planted score strength and copy gain (bounds of the spectral targets)


def answer_schema(level: str) -> dict:
    n_heads = LEVELS[level][1]
    return {
        "type": "object",
        "additionalProperties": {"enum": list(ROLES)},
        "description": 'a role for every head, keyed "L{layer}H{head}"',
        "x-kind": AnswerKind.ROLES,
        "x-universe": N_LAYERS * n_heads,
        "x-k-max": N_LAYERS * n_heads,
        "x-n-layers": N_LAYERS,
        "x-n-heads": n_heads,
        "x-roles": list(ROLES),
    }


def role_scores(pattern: torch.Tensor) -> dict[str, torch.Tensor]:
    """Detection scores per head from patterns [batch, head, query, key] of the probe sequences."""
    i = torch.arange(N_CTX)
    second = i[HALF:]
    return {
        "previous-token": pattern[:, :, i[1:], i[1:] - 1].mean(dim=(0, 2)),
        "duplicate-token": pattern[:, :, second, second - HALF].mean(dim=(0, 2)),
        "induction": pattern[:, :, second, second - HALF + 1].mean(dim=(0, 2)),
        "attend-to-first": pattern[:, :, i[1:], 0].mean(dim=(0, 2)),
        "local": (pattern[:, :, i[3:], i[3:] - 2] + pattern[:, :, i[3:], i[3:] - 3]).mean(dim=(0, 2)),
    }


def detect_roles(model: HookedTransformer, tokens: torch.Tensor) -> tuple[dict[tuple[int, int], str], dict]:
    """(role per head by the stated rule, {head: {role: score}})."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    roles, scores = {}, {}
    for layer in range(model.cfg.n_layers):
        per_role = role_scores(cache[f"blocks.{layer}.attn.hook_pattern"])
        for head in range(model.cfg.n_heads):
            s = {r: float(v[head]) for r, v in per_role.items()}
            hits = [r for r, v in s.items() if v >= THRESHOLD]
            roles[(layer, head)] = hits[0] if len(hits) == 1 else "none" if not hits else "ambiguous"
            scores[(layer, head)] = s
    return roles, scores


def _layout(vocab: int) -> Layout:
    lay = Layout()
    for name, dim in (("tok", vocab), ("prev", vocab), ("out", vocab), ("scr", vocab), ("pos", N_CTX), ("const", 1),
                      ("pad", vocab + N_CTX + PAD_EXTRA), ("sink", vocab + N_CTX + PAD_EXTRA)):  # fmt: skip
        lay.add(name, dim)
    for f in range(N_FLAGS):
        lay.add(f"flag{f}", 1)
    return lay


def _layer_roles(s: Stream, layer: int, n_heads: int) -> list[str]:
    """Every role the layer can hold, then extra draws (so some role repeats), in a random order."""
    allowed = LAYER0 if layer == 0 else ROLES
    roles = list(allowed) + [s.pick(allowed) for _ in range(n_heads - len(allowed))]
    return [roles[i] for i in s.permutation(n_heads)]


def _plant(p: Planter, s: Stream, layer: int, head: int, role: str, vocab: int, copies_prev: bool) -> None:
    lay = p.lay
    toks = list(range(vocab))
    st = s.fraction(6.0, 8.0)
    if role == "previous-token":
        attend_offset(p, layer, head, 1, st)
    elif role == "local":
        attend_offset(p, layer, head, s.pick((2, 3)), st)
    elif role == "attend-to-first":
        attend_flag(p, layer, head, lay.idx("pos", 0), st)
    elif role == "duplicate-token":  # same token, but not itself
        pairs = [(lay.idx("tok", t), lay.idx("tok", t), st) for t in toks]
        pairs += [(lay.idx("pos", i), lay.idx("pos", i), -st) for i in range(N_CTX)]
        p.qk(layer, head, pairs)
    elif role == "induction":  # keys carry the previous token (K-composition with a layer-0 head)
        p.qk(layer, head, [(lay.idx("tok", t), lay.idx("prev", t), st) for t in toks])
    else:  # none: content attention to a token subset, spread over many positions
        attend_flag(p, layer, head, lay.idx(f"flag{s.below(N_FLAGS)}"), s.fraction(1.0, 2.5))
    if copies_prev:
        copy_tokens(p, layer, head, toks, "prev", 1.0)
    else:
        k = s.between(vocab // 2, vocab)
        picked = [toks[i] for i in s.sample(vocab, k)]
        copy_tokens(p, layer, head, picked, "scr", s.fraction(0.8, 2.0), s.sample(vocab, k))


def _probe(s: Stream, vocab: int) -> torch.Tensor:
    rows = []
    for _ in range(N_PROBE):
        first = s.sample(vocab, HALF)
        rows.append(first + first)
    return torch.tensor(rows)


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    vocab, n_heads, noise = LEVELS[level]
    lay = _layout(vocab)
    cfg = HookedConfig(n_layers=N_LAYERS, n_heads=n_heads, d_model=lay.size + 4, d_head=vocab + N_CTX + PAD_EXTRA,
                       d_vocab=vocab, n_ctx=N_CTX)  # fmt: skip
    roles = {(layer, h): r for layer in range(N_LAYERS) for h, r in enumerate(_layer_roles(s, layer, n_heads))}
    dh = cfg.d_head
    # one QK and one OV singular-value profile per layer, from constants only (see circuits.pad_spectrum)
    targets = [(spectral_target(s, QK_MAX * dh**0.5, dh), spectral_target(s, OV_MAX, dh)) for _ in range(N_LAYERS)]
    while True:
        p = Planter(cfg, lay)
        p.embed_basics(out_gain=1.0)
        for f in range(N_FLAGS):
            p.flag_tokens(f"flag{f}", [t for t in range(vocab) if s.below(4) == 0])
        first_prev = min(h for (layer, h), r in roles.items() if layer == 0 and r == "previous-token")
        for (layer, head), role in roles.items():
            _plant(p, s, layer, head, role, vocab, copies_prev=(layer, head) == (0, first_prev))
        for layer, head in roles:  # every head of a layer: the same QK and the same OV spectrum
            pad_spectrum(p, s, layer, head, "qk", targets[layer][0], "pad")
            pad_spectrum(p, s, layer, head, "ov", targets[layer][1], "pad", "sink")
        model = p.build(s, noise)
        tokens = _probe(s, vocab)
        _, scores = detect_roles(model, tokens)
        ok = True
        for head, role in roles.items():
            mine = scores[head].get(role, 0.0)
            others = max(v for r, v in scores[head].items() if r != role)
            ok = ok and (role == "none" or mine >= PLANTED_MIN) and others <= OTHER_MAX
        if ok:
            break
    new_of = permute_heads(model, s)
    truth_roles = {f"L{layer}H{new_of[layer][h]}": r for (layer, h), r in roles.items()}
    return Instance(
        task_id=TASK_ID,
        level=level,
        seed=seed,
        family_version=VERSION,
        model=model,
        probe={"tokens": tokens},
        config={"kind": "hooked-transformer", **cfg.to_dict()},
        prompt=prompt.TEXT.format(
            n_layers=N_LAYERS,
            n_heads=n_heads,
            vocab=vocab,
            n_ctx=N_CTX,
            n_probe=N_PROBE,
            half=HALF,
            threshold=THRESHOLD,
            example=prompt.EXAMPLE,
        ),
        answer_schema=answer_schema(level),
        truth={"kind": AnswerKind.ROLES, "n_layers": N_LAYERS, "n_heads": n_heads, "roles": truth_roles},
    )
