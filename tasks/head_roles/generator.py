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
- none: every score below the threshold (heads that attend 4-6 positions back).
A head's role is the role whose score reaches THRESHOLD (at most one can); otherwise "none". Each
graded block's role multiset contains every role it can hold plus extra draws, so some role always
appears twice in a block (a redundant pair). The generator checks every head's scores with a margin.

Why block 0 (versions 3-4, issue 16): in an attention-only model a first-layer head's scores are exactly
the bilinear form of the embeddings, so W_pos QK W_pos^T *is* a positional head's rule and
W_E QK W_E^T a content head's, and the role is a weight reading. Here the embeddings carry only raw
codes (positions and tokens as signed one-hot codes) that no head reads; block 0's MLP decodes them into the
features the heads read (one-hot positions twice and tokens three times, a constant; version 5 also had flags and a
pad). Version 4's
decoder (decoder.py) has no unit that writes one feature: each unit reads a few codes and writes a dense
mixture, the firing units of a code summing to its features exactly, and never-firing units complete the
write map to an isometry; so a head's circuits read in the unit basis, W_out QK W_out^T and W_out OV, have
the head's own (layer-matched) spectra and no entry that is a planted one (version 3's units wrote one feature
each, and counting the large entries of W_out QK W_out^T named the role). A head's role is readable by running
the model, or by reading the MLP as the decoder it is (which units fire on which code, from W_in) and the heads in
the decoded basis.
Version 5 was version 4's construction with ``circuits.canonical_svd`` in its spectral padding (version 4 built the
pad from whatever basis LAPACK returned for equal singular values, so its weights differed between machines).
Version 6 (issue 16's last open finding): versions 1-5 gave every head of a block one spectral profile by padding its
planted circuit in one subspace, ``pad``, shared by every head; the heaviest eigenspace of the heads' summed projectors
found it, and the stripped circuit's rank named the role (0.83-0.87; a red team's rank rule 0.99). No padding of that
kind can hide a rank (a head's pad mass is what its role leaves unused). So version 6 has no pad: every head has one
structure (``positional_part`` and ``_plant``), a positional part, a constant-query pair and two token parts, each of
fixed size and reading the same subspaces whatever the role, every pair at the block's strength; the role is in
*which* pairs (an offset or its causally masked mirror, the identity or a derangement), readable only in the decoded
basis or from the attention patterns. The copies are chosen so that no chain of a head's and the copying head's maps
closes on the same copy (queries read ``tok`` and ``tok2``, keys ``tok`` and ``prev``, values ``tok3``): the trace of
an induction head's key circuit composed with the copying head's OV was the identity's (``composed:ktokcomp_in``
labelled induction heads until the values moved to ``tok3``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ...answer_kind import AnswerKind
from ...arch import HookedConfig, HookedTransformer
from ..base import Instance
from ..circuits import Layout, Planter, permute_heads
from ..rng import Stream
from . import decoder, prompt

TASK_ID = "head-roles"
VERSION = "6"
ROLES = ("previous-token", "duplicate-token", "induction", "attend-to-first", "local", "none")
FIRST_ROLES = ("previous-token", "duplicate-token", "attend-to-first", "local", "none")  # block 1: no induction
HALF, N_PROBE, N_LAYERS = 8, 64, 3
FIRST = 1  # block 0 is the MLP-only re-encoder; blocks FIRST.. hold the graded heads
N_CTX = 2 * HALF
LEVELS = {"easy": (24, 8, 0.0), "medium": (28, 9, 0.01), "hard": (32, 10, 0.02)}  # vocab, heads/layer, noise
THRESHOLD = 0.4  # stated in the prompt
PLANTED_MIN, OTHER_MAX = 0.55, 0.25  # enforced by the generator
STRENGTH = (6.0, 8.0)  # every QK pair of a block: one strength, drawn per block
GAIN = (0.8, 2.0)  # every OV pair of a block: one copy gain, drawn per block
NONE_OFFSETS = (4, 5, 6)  # "none" heads attend this far back: no role's target (induction's is 7 back, dup's 8)
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
    """The unrotated residual basis. Block 0 decodes every token into ``tok``, ``tok2`` and ``tok3`` and every position
    into ``pos`` and ``pos2`` (equal on the data, so a head reads a token or a position on each side, and its values,
    from different copies: no circuit reads a dim on both sides, every QK is traceless, and no chain of maps closes
    on one copy); ``prev`` is what block 1's copying head writes (block 2's heads write there too, unread), ``scr``
    what block 1's other heads write (nothing reads it). ``out``, read by the unembedding, is written by nothing: the
    task grades attention patterns, not outputs."""
    lay = Layout()
    for name, dim in (("rawpos", N_CTX), ("rawtok", vocab),  # what the embeddings hold
                      ("tok", vocab), ("tok2", vocab), ("tok3", vocab), ("prev", vocab), ("out", vocab), ("scr", vocab),
                      ("pos", N_CTX),
                      ("pos2", N_CTX), ("const", 1)):  # fmt: skip
        lay.add(name, dim)
    return lay


def decoded(lay: Layout) -> list[int]:
    """Every residual dim a head's QK or OV reads: written by block 0's MLP (``prev`` too, never on the data)."""
    return [i for n in ("tok", "tok2", "tok3", "prev", "pos", "pos2", "const") for i in range(*lay.spans[n])]


def _d_head(vocab: int) -> int:
    return 2 * vocab + N_CTX  # every head's QK: the positional part (N_CTX pairs) and two token parts (vocab each)


def _n_units(vocab: int) -> int:
    return decoder.n_units([N_CTX, vocab], len(decoded(layout(vocab))))


def _embed(p: Planter, s: Stream) -> None:
    """Raw codes only: each position and each token a signed one-hot code; the unembedding reads ``out``."""
    lay, vocab = p.lay, p.cfg.d_vocab
    for t in range(vocab):
        p.W_E[t, lay.idx("rawtok", t)] = _sign(s)
        p.W_U[lay.idx("out", t), t] = 1.0
    for i in range(N_CTX):
        p.W_pos[i, lay.idx("rawpos", i)] = _sign(s)


def _sign(s: Stream) -> float:
    return 1.0 if s.below(2) else -1.0


def _decoder(p: Planter, s: Stream) -> None:
    """Block 0's MLP (tasks/head_roles/decoder.py): a position decodes to its ``pos`` and ``pos2`` features and half
    the constant, a token to its ``tok`` and ``tok2`` features and the constant's other half; ``prev`` is decoded
    from nothing (what block 1 writes later), so only the never-firing units and the firing units' cancelling parts
    write it."""
    lay = p.lay
    features = decoded(lay)
    col = {dim: j for j, dim in enumerate(features)}

    def rows(n: int, names: Callable[[int], list[int]]) -> np.ndarray:
        """Targets: each code's features at 1, and half the constant (each input holds one code of each kind)."""
        t = np.zeros((n, len(features)))
        t[:, col[lay.idx("const")]] = 0.5
        for c in range(n):
            t[c, [col[dim] for dim in names(c)]] = 1.0
        return t

    pos = decoder.Kind(
        [(lay.idx("rawpos", i), float(p.W_pos[i, lay.idx("rawpos", i)])) for i in range(N_CTX)],
        rows(N_CTX, lambda i: [lay.idx("pos", i), lay.idx("pos2", i)]),
    )
    tok = decoder.Kind(
        [(lay.idx("rawtok", t), float(p.W_E[t, lay.idx("rawtok", t)])) for t in range(p.cfg.d_vocab)],
        rows(p.cfg.d_vocab, lambda t: [lay.idx("tok", t), lay.idx("tok2", t), lay.idx("tok3", t)]),
    )
    decoder.plant(p, s, [pos, tok], features)


def config(level: str) -> HookedConfig:
    vocab, n_heads, _ = LEVELS[level]
    return HookedConfig(n_layers=N_LAYERS, n_heads=n_heads, d_model=layout(vocab).size + 4, d_head=_d_head(vocab),
                        d_vocab=vocab, n_ctx=N_CTX, d_mlp=_n_units(vocab), attn_only=False)  # fmt: skip


def block0(p: Planter, s: Stream) -> None:
    """The embeddings' raw codes and block 0's decoder, planted into ``p``."""
    _embed(p, s)
    _decoder(p, s)


def _layer_roles(s: Stream, layer: int, n_heads: int) -> list[str]:
    """Every role the block can hold, then extra draws (so some role repeats), in a random order."""
    allowed = FIRST_ROLES if layer == FIRST else ROLES
    roles = list(allowed) + [s.pick(allowed) for _ in range(n_heads - len(allowed))]
    return [roles[i] for i in s.permutation(n_heads)]


def positional_part(role: str, offset: int) -> tuple[list[tuple[int, int, float]], int, float]:
    """Every head's positional part: 15 (query ``pos`` i, key ``pos2`` j, sign) pairs, a partial permutation, and the
    one key position it leaves free, with the sign of the constant query's pair on it (the 16th). What differs by role
    is which pairs, never how many or what they read:
    - an offset d (previous-token 1, local 2-3, none 4-6): i -> i - d for i >= d, and the first d - 1 queries wrap to
      the last keys (j > i: causally masked, so inert); key 16 - d is free and the constant pair avoids it;
    - attend-to-first, induction: i -> i + 1 (every pair masked: inert); key 0 is free, and the constant pair is the
      role for attend-to-first (+) and avoids position 0 for induction (-);
    - duplicate-token: i -> i with sign - for i >= 1 (the head avoids itself, whose token it reads too); key 0 is free
      and avoided."""
    n = N_CTX
    if role == "duplicate-token":
        return [(i, i, -1.0) for i in range(1, n)], 0, -1.0
    if role in ("attend-to-first", "induction"):
        return [(i, i + 1, 1.0) for i in range(n - 1)], 0, 1.0 if role == "attend-to-first" else -1.0
    pairs = [(i, i - offset, 1.0) for i in range(offset, n)] + [(r, n + 1 - offset + r, 1.0) for r in range(offset - 1)]
    return pairs, n - offset, -1.0


def _offset(s: Stream, role: str) -> int:
    return {"previous-token": 1, "local": 2 + s.below(2)}.get(role) or s.pick(NONE_OFFSETS)


def _derangement(s: Stream, n: int) -> list[int]:
    while True:
        perm = s.permutation(n)
        if all(int(perm[t]) != t for t in range(n)):
            return [int(v) for v in perm]


def _plant(p: Planter, s: Stream, layer: int, head: int, role: str, st: float, gain: float, copies_prev: bool) -> None:
    """One head: its positional part (positional_part), then two token parts that every head has: ``tok`` t against
    ``prev`` of sigma(t) (the identity for induction; in block 1, where ``prev`` is still zero, any permutation, all
    inert; elsewhere a derangement: a sparse distractor on the token after another token) and ``tok2`` t against
    ``tok`` of tau(t) (the identity for duplicate-token, a derangement otherwise). Every pair has the block's strength
    on its own query and key dims, so every head's QK is one partial isometry times that strength: the same rank and
    singular values, reading the same subspaces. OV: every head copies every token from ``tok3`` at the block's gain
    (block 1's copying head into ``prev``, the identity; block 1's other heads into ``scr``, permuted; block 2's into
    ``prev``, permuted, which nothing reads after them). (``_offset`` draws for every role, so the stream, and the
    version's bytes, depend on that.)"""
    lay = p.lay
    vocab = p.cfg.d_vocab
    pairs, free, sign = positional_part(role, _offset(s, role))
    qk = [(lay.idx("pos", i), lay.idx("pos2", j), sg * st) for i, j, sg in pairs]
    qk.append((lay.idx("const"), lay.idx("pos2", free), sign * st))
    if role == "induction":
        sigma = list(range(vocab))
    elif layer == FIRST:
        sigma = [int(v) for v in s.permutation(vocab)]
    else:
        sigma = _derangement(s, vocab)
    tau = list(range(vocab)) if role == "duplicate-token" else _derangement(s, vocab)
    qk += [(lay.idx("tok", t), lay.idx("prev", sigma[t]), st) for t in range(vocab)]
    qk += [(lay.idx("tok2", t), lay.idx("tok", tau[t]), st) for t in range(vocab)]
    p.qk(layer, head, [qk[i] for i in s.permutation(len(qk))])
    dst = list(range(vocab)) if copies_prev else [int(v) for v in s.permutation(vocab)]
    space = "scr" if layer == FIRST and not copies_prev else "prev"  # block 2's writes into prev are read by nothing
    p.ov(layer, head, [(lay.idx("tok3", t), lay.idx(space, dst[t]), gain) for t in range(vocab)])


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
    cfg = config(level)
    graded = range(FIRST, N_LAYERS)
    roles = {(layer, h): r for layer in graded for h, r in enumerate(_layer_roles(s, layer, n_heads))}
    # one QK strength and one OV gain per block, whatever its roles (every head's circuits then have one spectrum)
    strength = {layer: s.fraction(*STRENGTH) for layer in graded}
    gain = {layer: s.fraction(*GAIN) for layer in graded}
    while True:
        p = Planter(cfg, lay)
        block0(p, s)
        first_prev = min(h for (layer, h), r in roles.items() if layer == FIRST and r == "previous-token")
        for (layer, head), role in roles.items():
            copies = (layer, head) == (FIRST, first_prev)
            _plant(p, s, layer, head, role, strength[layer], gain[layer], copies)
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
