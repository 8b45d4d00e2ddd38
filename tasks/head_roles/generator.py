"""Generator for head-roles: a 3-block transformer whose block 0 is only an MLP that re-encodes
tokens and positions, and whose every head of blocks 1 and 2 has a role defined by an
attention-pattern detection score on the probe set (TransformerLens ``detect_head`` style), at head
positions that vary by seed.

Roles and their scores (mean attention, over probe sequences of ``HALF`` random tokens repeated twice):
- previous-token: on position i - 1 (positions i >= 1);
- duplicate-token: on the earlier copy of the current token, i - HALF (second-half positions);
- induction: on the token after that copy, i - HALF + 1 (second-half positions; block 2 only, via
  K-composition with a block-1 head that copies the previous token);
- attend-to-first: on position 0 (positions i >= 1);
- local: on positions i - 2 and i - 3 together (positions i >= 3);
- none: every score below the threshold (content heads that attend to a token subset).
A head's role is the role whose score reaches THRESHOLD (at most one can); otherwise "none". Each
graded block's role multiset contains every role it can hold plus extra draws, so some role always
appears twice in a block (a redundant pair). The generator checks every head's scores with a margin.

Why block 0 (version 3, issue 16): in an attention-only model a first-layer head's scores are exactly
the bilinear form of the embeddings, so W_pos QK W_pos^T *is* a positional head's rule and
W_E QK W_E^T a content head's, and the role is a weight reading. Here the embeddings carry only raw
codes (positions, tokens and flags as signed one-hot codes) that no head reads; block 0's MLP decodes
them into the features the heads read (one-hot positions, tokens, flags, a constant), and every
decoder unit has a partner reading the opposite direction and writing the same vector, which never
fires on the data, so the MLP has no linear part (dropping its ReLU
gives zero). Its write map is an isometry (every feature a head reads is written by exactly two
units of the same size, the never-firing features included), so the neuron-space circuits
W_out QK W_out^T and W_out OV are the heads' own (layer-matched) spectra, and every head touches every
feature by a tiny inert (or near-inert) term, so no count of non-zero rows gives a role's support. Open
(docs/TASKS.md, "Open findings"): the units write one feature each, so the *entries* of W_out QK W_out^T are
the planted circuit in a privileged basis, and counting its large ones gives the role. A head's role is
readable by running the model, or by reading the MLP as the decoder it is.
"""

from __future__ import annotations

import numpy as np
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
VERSION = "3"
ROLES = ("previous-token", "duplicate-token", "induction", "attend-to-first", "local", "none")
FIRST_ROLES = ("previous-token", "duplicate-token", "attend-to-first", "local", "none")  # block 1: no induction
HALF, N_PROBE, N_LAYERS = 8, 64, 3
FIRST = 1  # block 0 is the MLP-only re-encoder; blocks FIRST.. hold the graded heads
N_CTX = 2 * HALF
LEVELS = {"easy": (24, 8, 0.0), "medium": (28, 9, 0.01), "hard": (32, 10, 0.02)}  # vocab, heads/layer, noise
THRESHOLD = 0.4  # stated in the prompt
PLANTED_MIN, OTHER_MAX = 0.55, 0.25  # enforced by the generator
N_FLAGS = 3
PAD_EXTRA = 8  # head dims beyond the largest planted job
QK_MAX, OV_MAX = 8.0, 2.0  # the largest planted score strength and copy gain (bounds of the spectral targets)
# block 0's decoders: every raw code is a signed one-hot of size 1; a unit reads one code direction (gain 4) with
# bias -3, so it fires at 1 on its code and stays at -3 elsewhere; a never-firing unit reads the mean direction of
# three codes of one kind (an input holds one position code and one token code), which reaches only 4/sqrt(3) - 3
CUT = 3.0
TOUCH = 0.01  # strength of the inert terms that make every head touch every decoded feature


def answer_schema(level: str) -> dict:
    n_heads = LEVELS[level][1]
    graded = N_LAYERS - FIRST
    return {
        "type": "object",
        "additionalProperties": {"enum": list(ROLES)},
        "description": f'a role for every head of blocks {FIRST}-{N_LAYERS - 1}, keyed "L{{layer}}H{{head}}"',
        "x-kind": AnswerKind.ROLES,
        "x-universe": graded * n_heads,
        "x-k-max": graded * n_heads,
        "x-n-layers": N_LAYERS,
        "x-first-layer": FIRST,
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


def detect_roles(
    model: HookedTransformer, tokens: torch.Tensor, first: int = FIRST
) -> tuple[dict[tuple[int, int], str], dict]:
    """(role per head of blocks ``first``.. by the stated rule, {head: {role: score}})."""
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    roles, scores = {}, {}
    for layer in range(first, model.cfg.n_layers):
        per_role = role_scores(cache[f"blocks.{layer}.attn.hook_pattern"])
        for head in range(model.cfg.n_heads):
            s = {r: float(v[head]) for r, v in per_role.items()}
            hits = [r for r, v in s.items() if v >= THRESHOLD]
            roles[(layer, head)] = hits[0] if len(hits) == 1 else "none" if not hits else "ambiguous"
            scores[(layer, head)] = s
    return roles, scores


def _layout(vocab: int) -> Layout:
    """The unrotated residual basis. ``tok2`` / ``pos2`` are second decoded copies of the token and position that
    duplicate-token keys read: reading ``tok`` on both sides gave that role's QK a trace (st * (vocab - N_CTX)) where
    every other role's is zero, which any random projection of the weights (the embeddings' noise) showed."""
    lay = Layout()
    dh = _d_head(vocab)
    for name, dim in (("rawpos", N_CTX), ("rawtok", vocab), ("rawflag", N_FLAGS),  # what the embeddings hold
                      ("tok", vocab), ("tok2", vocab), ("prev", vocab), ("out", vocab), ("scr", vocab), ("pos", N_CTX),
                      ("pos2", N_CTX), ("const", 1),
                      ("pad", dh), ("sink", dh)):  # fmt: skip
        lay.add(name, dim)
    for f in range(N_FLAGS):
        lay.add(f"flag{f}", 1)
    return lay


def decoded(lay: Layout) -> list[int]:
    """Every residual dim a head's QK or OV reads: written by block 0's MLP (the pad too, never on the data)."""
    names = ["tok", "tok2", "prev", "pos", "pos2", "const", "pad", *(f"flag{f}" for f in range(N_FLAGS))]
    return [i for n in names for i in range(*lay.spans[n])]


def _d_head(vocab: int) -> int:
    return vocab + N_CTX + PAD_EXTRA  # the largest planted job (duplicate-token: vocab + N_CTX pairs) and spare


def _n_units(vocab: int) -> int:
    dh = _d_head(vocab)
    # two units per feature: positions and tokens (twice each), flags, the constant, and the silent prev and pad
    return 2 * (2 * N_CTX + 2 * vocab + N_FLAGS + 1 + vocab + dh)


def _embed(p: Planter, s: Stream, flags: list[list[int]]) -> None:
    """Raw codes only: each position and each token a signed one-hot code, each flag a signed bit on its tokens;
    the unembedding reads ``out`` (what heads write there)."""
    lay, vocab = p.lay, p.cfg.d_vocab
    for t in range(vocab):
        p.W_E[t, lay.idx("rawtok", t)] = _sign(s)
        p.W_U[lay.idx("out", t), t] = 1.0
    for f, tokens in enumerate(flags):
        for t in tokens:
            p.W_E[t, lay.idx("rawflag", f)] = _sign(s)
    for i in range(N_CTX):
        p.W_pos[i, lay.idx("rawpos", i)] = _sign(s)


def _sign(s: Stream) -> float:
    return 1.0 if s.below(2) else -1.0


def _unit_pair(p: Planter, reads: list[tuple[int, float]], dim: int) -> None:
    """Two units reading opposite directions (``reads``, unit norm, and minus it), both writing ``dim``: a code
    fires at most one of them, and their linear parts cancel (the MLP without its ReLU writes nothing)."""
    for sign in (1.0, -1.0):
        p.mlp_unit(0, [(d, sign * (CUT + 1.0) * w) for d, w in reads], -CUT, [(dim, 1.0)])


def _decoder(p: Planter, s: Stream) -> None:
    """Block 0's MLP: the features every head reads, decoded from the raw codes (two units per feature)."""
    lay = p.lay
    for raw, feature in (("rawpos", "pos"), ("rawpos", "pos2"), ("rawtok", "tok"), ("rawtok", "tok2")):
        for i in range(lay.dim(raw)):
            _unit_pair(p, [(lay.idx(raw, i), 1.0)], lay.idx(feature, i))
    for f in range(N_FLAGS):
        _unit_pair(p, [(lay.idx("rawflag", f), 1.0)], lay.idx(f"flag{f}"))
    for _ in range(2):  # the constant: two always-on units of half the activation
        p.mlp_unit(0, [], 0.5, [(lay.idx("const"), 1.0)])
    # the features nothing decodes on the data (what block 1 writes later, the spectral pad): never-firing pairs
    for name in ("prev", "pad"):
        for i in range(lay.dim(name)):
            raw = s.pick(("rawpos", "rawtok"))
            codes = s.sample(lay.dim(raw), 3)
            _unit_pair(p, [(lay.idx(raw, c), _sign(s) / np.sqrt(3.0)) for c in codes], lay.idx(name, i))


def _touch_all(p: Planter, s: Stream, layer: int, head: int) -> None:
    """Make the head's QK and OV touch every decoded feature (the number of non-zero rows of its unit-basis
    readings would otherwise count its role's support; a count of large entries still does: the open finding).
    QK gains TOUCH * (x_q . g) (x_k . const), constant over keys, and TOUCH * (x_k . h), a near-inert key bias
    (|h| = 1); OV writes TOUCH * (x . g') into ``scr``, which nothing reads."""
    lay = p.lay
    dims = [d for d in decoded(lay) if not lay.spans["pad"][0] <= d < lay.spans["pad"][1]]
    used_qk, used_ov = p.free_qk_dim(layer, head), p.free_ov_dim(layer, head)
    scale = np.sqrt(np.sqrt(p.cfg.d_head))
    g, h, g2 = (v / np.linalg.norm(v) for v in (s.normal(len(dims)), s.normal(len(dims)), s.normal(len(dims))))
    const = lay.idx("const")
    p.W_Q[layer, head, dims, used_qk] = g * np.sqrt(TOUCH) * scale
    p.W_K[layer, head, const, used_qk] = np.sqrt(TOUCH) * scale
    p.W_Q[layer, head, const, used_qk + 1] = TOUCH * scale
    p.W_K[layer, head, dims, used_qk + 1] = h * scale
    p.W_V[layer, head, dims, used_ov] = g2
    p.W_O[layer, head, used_ov, lay.idx("scr", s.below(lay.dim("scr")))] = TOUCH


def _layer_roles(s: Stream, layer: int, n_heads: int) -> list[str]:
    """Every role the block can hold, then extra draws (so some role repeats), in a random order."""
    allowed = FIRST_ROLES if layer == FIRST else ROLES
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
    elif role == "duplicate-token":  # same token, but not itself; keys read the second copies (see _layout)
        pairs = [(lay.idx("tok", t), lay.idx("tok2", t), st) for t in toks]
        pairs += [(lay.idx("pos", i), lay.idx("pos2", i), -st) for i in range(N_CTX)]
        p.qk(layer, head, pairs)
    elif role == "induction":  # keys carry the previous token (K-composition with a block-1 head)
        p.qk(layer, head, [(lay.idx("tok", t), lay.idx("prev", t), st) for t in toks])
    else:  # none: content attention to a token subset, spread over many positions
        attend_flag(p, layer, head, lay.idx(f"flag{s.below(N_FLAGS)}"), s.fraction(1.0, 2.5))
    if copies_prev:
        copy_tokens(p, layer, head, toks, "prev", 1.0)
    else:
        k = s.between(vocab // 2, vocab)
        picked = [toks[i] for i in s.sample(vocab, k)]
        copy_tokens(p, layer, head, picked, "scr", s.fraction(0.8, 2.0), s.sample(vocab, k))
    _touch_all(p, s, layer, head)


def _probe(s: Stream, vocab: int) -> torch.Tensor:
    rows = []
    for _ in range(N_PROBE):
        first = s.sample(vocab, HALF)
        rows.append(first + first)
    return torch.tensor(rows)


def _switch_off(model: HookedTransformer) -> None:
    """Block 0 has no attention and blocks 1.. no MLP: their weights are exactly zero (no noise either)."""
    with torch.no_grad():
        for param in model.blocks[0].attn.parameters():
            param.zero_()
        for block in model.blocks[FIRST:]:
            for param in block.mlp.parameters():
                param.zero_()


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    vocab, n_heads, noise = LEVELS[level]
    lay = _layout(vocab)
    dh = _d_head(vocab)
    cfg = HookedConfig(n_layers=N_LAYERS, n_heads=n_heads, d_model=lay.size + 4, d_head=dh, d_vocab=vocab,
                       n_ctx=N_CTX, d_mlp=_n_units(vocab), attn_only=False)  # fmt: skip
    graded = range(FIRST, N_LAYERS)
    roles = {(layer, h): r for layer in graded for h, r in enumerate(_layer_roles(s, layer, n_heads))}
    # one QK and one OV singular-value profile per block, from constants only (see circuits.pad_spectrum)
    targets = {layer: (spectral_target(s, QK_MAX * dh**0.5, dh), spectral_target(s, OV_MAX, dh)) for layer in graded}
    while True:
        p = Planter(cfg, lay)
        _embed(p, s, [[t for t in range(vocab) if s.below(4) == 0] for _ in range(N_FLAGS)])
        _decoder(p, s)
        first_prev = min(h for (layer, h), r in roles.items() if layer == FIRST and r == "previous-token")
        for (layer, head), role in roles.items():
            _plant(p, s, layer, head, role, vocab, copies_prev=(layer, head) == (FIRST, first_prev))
        for layer, head in roles:  # every head of a block: the same QK and the same OV spectrum
            pad_spectrum(p, s, layer, head, "qk", targets[layer][0], "pad", traceless=True)
            pad_spectrum(p, s, layer, head, "ov", targets[layer][1], "pad", "sink")
        model = p.build(s, noise)
        _switch_off(model)
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
            last=N_LAYERS - 1,
            n_heads=n_heads,
            vocab=vocab,
            n_ctx=N_CTX,
            n_probe=N_PROBE,
            half=HALF,
            threshold=THRESHOLD,
            example=prompt.EXAMPLE,
        ),
        answer_schema=answer_schema(level),
        truth={
            "kind": AnswerKind.ROLES,
            "n_layers": N_LAYERS,
            "first_layer": FIRST,
            "n_heads": n_heads,
            "roles": truth_roles,
        },
    )
