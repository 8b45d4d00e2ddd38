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

Why block 0 (versions 3-4, issue 16): in an attention-only model a first-layer head's scores are exactly
the bilinear form of the embeddings, so W_pos QK W_pos^T *is* a positional head's rule and
W_E QK W_E^T a content head's, and the role is a weight reading. Here the embeddings carry only raw
codes (positions and tokens as signed one-hot codes) that no head reads; block 0's MLP decodes them into the
features the heads read (one-hot positions and tokens, twice each, the token's flags, a constant). Version 4's
decoder (decoder.py) has no unit that writes one feature: each unit reads a few codes and writes a dense
mixture, the firing units of a code summing to its features exactly, and never-firing units complete the
write map to an isometry; so a head's circuits read in the unit basis, W_out QK W_out^T and W_out OV, have
the head's own (layer-matched) spectra and no entry that is a planted one (version 3's units wrote one feature
each, and counting the large entries of W_out QK W_out^T named the role). Every head touches every feature by
a tiny inert (or near-inert) term. A head's role is readable by running the model, or by reading the MLP as the
decoder it is (which units fire on which code, from W_in) and the heads in the decoded basis.
Version 5 is version 4's construction with ``circuits.canonical_svd`` in the spectral padding: version 4 built the
pad from whatever basis LAPACK returned for equal singular values, so its weights, and under hard's noise its accepted
draw, differed between machines (hard seed 7's truth on an AMD EPYC against the recorded one;
tests/test_platform_independence.py).
"""

from __future__ import annotations

from collections.abc import Callable

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
from . import decoder, prompt

TASK_ID = "head-roles"
VERSION = "5"
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
TOUCH = 0.01  # strength of the inert terms that make every head touch every decoded feature
# block 0 has no attention and blocks FIRST.. no MLP: their weights are exactly zero (Planter.build draws no noise)
SWITCHED_OFF = ("blocks.0.attn.", *(f"blocks.{layer}.mlp." for layer in range(FIRST, N_LAYERS)))


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


def layout(vocab: int) -> Layout:
    """The unrotated residual basis. ``tok2`` / ``pos2`` are second decoded copies of the token and position that
    duplicate-token keys read: reading ``tok`` on both sides gave that role's QK a trace (st * (vocab - N_CTX)) where
    every other role's is zero, which any random projection of the weights (the embeddings' noise) showed."""
    lay = Layout()
    dh = _d_head(vocab)
    for name, dim in (("rawpos", N_CTX), ("rawtok", vocab),  # what the embeddings hold
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
    return decoder.n_units([N_CTX, vocab], len(decoded(layout(vocab))))


def _embed(p: Planter, s: Stream) -> None:
    """Raw codes only: each position and each token a signed one-hot code; the unembedding reads ``out`` (what heads
    write there). Flags are a function of the token, decoded by block 0 from the token's code."""
    lay, vocab = p.lay, p.cfg.d_vocab
    for t in range(vocab):
        p.W_E[t, lay.idx("rawtok", t)] = _sign(s)
        p.W_U[lay.idx("out", t), t] = 1.0
    for i in range(N_CTX):
        p.W_pos[i, lay.idx("rawpos", i)] = _sign(s)


def _sign(s: Stream) -> float:
    return 1.0 if s.below(2) else -1.0


def _decoder(p: Planter, s: Stream, flags: list[list[int]]) -> None:
    """Block 0's MLP (tasks/head_roles/decoder.py): a position decodes to its ``pos`` and ``pos2`` features and half
    the constant, a token to its ``tok`` and ``tok2`` features, its flags and the constant's other half; ``prev``
    and the pad are decoded from nothing (what block 1 writes later, the spectral pad), so only the never-firing
    units and the firing units' cancelling parts write them."""
    lay = p.lay
    features = decoded(lay)
    col = {dim: j for j, dim in enumerate(features)}

    def rows(n: int, names: Callable[[int], list[int]]) -> np.ndarray:
        """Targets: each code's features at 1, and half the constant (each input holds one code of each kind; so
        no kind's column of exact writes is heavier than a one-hot feature's)."""
        t = np.zeros((n, len(features)))
        t[:, col[lay.idx("const")]] = 0.5
        for c in range(n):
            t[c, [col[dim] for dim in names(c)]] = 1.0
        return t

    pos = decoder.Kind(
        [(lay.idx("rawpos", i), float(p.W_pos[i, lay.idx("rawpos", i)])) for i in range(N_CTX)],
        rows(N_CTX, lambda i: [lay.idx("pos", i), lay.idx("pos2", i)]),
    )
    flagged = [[lay.idx(f"flag{f}") for f, tokens in enumerate(flags) if t in tokens] for t in range(p.cfg.d_vocab)]
    tok = decoder.Kind(
        [(lay.idx("rawtok", t), float(p.W_E[t, lay.idx("rawtok", t)])) for t in range(p.cfg.d_vocab)],
        rows(p.cfg.d_vocab, lambda t: [lay.idx("tok", t), lay.idx("tok2", t), *flagged[t]]),
    )
    decoder.plant(p, s, [pos, tok], features)


def config(level: str) -> HookedConfig:
    vocab, n_heads, _ = LEVELS[level]
    return HookedConfig(n_layers=N_LAYERS, n_heads=n_heads, d_model=layout(vocab).size + 4, d_head=_d_head(vocab),
                        d_vocab=vocab, n_ctx=N_CTX, d_mlp=_n_units(vocab), attn_only=False)  # fmt: skip


def block0(p: Planter, s: Stream) -> list[list[int]]:
    """The embeddings' raw codes and block 0's decoder, planted into ``p``; returns the flags (tokens per flag)."""
    _embed(p, s)
    flags = [[t for t in range(p.cfg.d_vocab) if s.below(4) == 0] for _ in range(N_FLAGS)]
    _decoder(p, s, flags)
    return flags


def _touch_all(p: Planter, s: Stream, layer: int, head: int) -> None:
    """Make the head's QK and OV touch every decoded feature (the number of non-zero rows of its readings in the
    decoded basis would otherwise count its role's support; in the unit basis, version 4's dense writes hide it).
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
    elif role == "duplicate-token":  # same token, but not itself; keys read the second copies (see layout)
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


def generate(seed: int, level: str) -> Instance:
    s = Stream(seed, f"{TASK_ID}/{level}")
    vocab, n_heads, noise = LEVELS[level]
    lay = layout(vocab)
    dh = _d_head(vocab)
    cfg = config(level)
    graded = range(FIRST, N_LAYERS)
    roles = {(layer, h): r for layer in graded for h, r in enumerate(_layer_roles(s, layer, n_heads))}
    # one QK and one OV singular-value profile per block, from constants only (see circuits.pad_spectrum)
    targets = {layer: (spectral_target(s, QK_MAX * dh**0.5, dh), spectral_target(s, OV_MAX, dh)) for layer in graded}
    while True:
        p = Planter(cfg, lay)
        block0(p, s)
        first_prev = min(h for (layer, h), r in roles.items() if layer == FIRST and r == "previous-token")
        for (layer, head), role in roles.items():
            _plant(p, s, layer, head, role, vocab, copies_prev=(layer, head) == (FIRST, first_prev))
        for layer, head in roles:  # every head of a block: the same QK and the same OV spectrum
            pad_spectrum(p, s, layer, head, "qk", targets[layer][0], "pad", traceless=True)
            pad_spectrum(p, s, layer, head, "ov", targets[layer][1], "pad", "sink")
        model = p.build(s, noise, off=SWITCHED_OFF)
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
