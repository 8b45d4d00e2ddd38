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
codes (positions and tokens as signed one-hot codes) that no head reads; block 0's MLP (decoder.py) decodes them
into the features the heads read, with no unit that writes one feature (each unit reads a few codes and writes a
dense mixture, the firing units of a code summing to its features exactly, never-firing units completing the write
map to an isometry), so a head's circuits read in the unit basis have its own spectra and no entry that is a
planted one. A head's role is readable by running the model, or by reading the MLP as the decoder it is (which
units fire on which code, from W_in) and the heads in the decoded basis.

History: version 5 fixed version 4's machine-dependent pad basis; version 6 dropped the spectral pad every head
shared (its heaviest eigenspace gave the planted circuit back, whose rank named the role: 0.83-0.87) for one
structure per head whatever the role. Version 7 (issue 16's last open finding) closes two readings of version 6:
- heads planted with the same rule shared the same entries in the one decoded basis (every positional key read
  ``pos2``), so the Frobenius inner products of two heads' QK circuits counted shared pairs through any rotation,
  and products of two heads' circuits gave their relative offsets (one cyclic shift group): a red team 0.99. Here
  every graded head reads its keys' positions from a private copy, ``key{g}`` (SLOTS slots, decoded from the
  position codes in an order drawn per head, one slot decoded from nothing), and its token parts through powers of
  one random token cycle per part, distinct across the model (the identity only for the one induction head's
  ``prev`` part): no two heads share a planted entry, so every cross-head product is a permutation between spaces
  whose decoding only block 0 holds.
- a head's QK read on the sum of every code's decoded features (which the sum of block 0's firing writes gives)
  summed its pairs' signs: duplicate-token heads (every pair negative) and attend-to-first heads (a positive
  constant pair) stood out (0.45-0.50 with a learned fill). Here every pair of every head is positive, on the
  same number of decoded positions and tokens, with the constant pair on a real position: every such sum is one
  value for every head (duplicate-token is the offset HALF, which needs no self-avoiding negative pairs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...answer_kind import AnswerKind
from ...arch import HookedConfig, HookedTransformer
from ..base import Instance
from ..circuits import Layout, Planter, permute_heads
from ..rng import Stream
from . import decoder, prompt

TASK_ID = "head-roles"
VERSION = "7"
ROLES = ("previous-token", "duplicate-token", "induction", "attend-to-first", "local", "none")
FIRST_ROLES = ("previous-token", "duplicate-token", "attend-to-first", "local", "none")  # block 1: no induction
HALF, N_PROBE, N_LAYERS = 8, 64, 3
FIRST = 1  # block 0 is the MLP-only re-encoder; blocks FIRST.. hold the graded heads
N_CTX = 2 * HALF
LEVELS = {"easy": (24, 8, 0.0), "medium": (28, 9, 0.006), "hard": (32, 10, 0.01)}  # vocab, heads/layer, noise
THRESHOLD = 0.4  # stated in the prompt
PLANTED_MIN, OTHER_MAX = 0.55, 0.25  # enforced by the generator
STRENGTH = (6.0, 8.0)  # every QK pair of a block: one strength, drawn per block
GAIN = (0.8, 2.0)  # every OV pair of a block: one copy gain, drawn per block
NONE_OFFSETS = (4, 5, 6)  # "none" heads attend this far back: no role's target (induction's is 7 back, dup's 8)
SLOTS = N_CTX + 1  # a head's private key copy: a slot per position and a spare one, decoded from nothing
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


def layout(vocab: int, graded: int) -> Layout:
    """The unrotated residual basis. Block 0 decodes every token into ``tok``, ``tok2`` and ``tok3`` (queries read
    ``tok`` and ``tok2``, keys ``tok`` and ``prev``, values ``tok3``: no circuit reads a dim on both sides, every QK
    is traceless, and no chain of maps closes on one copy), every position into ``pos`` (what queries read) and into
    each graded head's private key copy ``key{g}`` (what that head's keys read), and half the constant from each
    code. ``prev`` is what block 1's copying head writes (block 2's heads write there too, unread), ``scr`` what
    block 1's other heads write (nothing reads it); the unembedding reads ``tok3`` (the task grades attention
    patterns, not outputs)."""
    lay = Layout()
    for name, dim in (("rawpos", N_CTX), ("rawtok", vocab),  # what the embeddings hold
                      ("tok", vocab), ("tok2", vocab), ("tok3", vocab), ("prev", vocab), ("scr", vocab),
                      ("pos", N_CTX), ("const", 1)):  # fmt: skip
        lay.add(name, dim)
    for g in range(graded):
        lay.add(f"key{g}", SLOTS)
    return lay


def decoded(lay: Layout) -> list[int]:
    """Every residual dim a head's QK or OV reads: written by block 0's MLP (``prev`` and each key copy's spare
    slot too, never on the data)."""
    names = ["tok", "tok2", "tok3", "prev", "pos", "const", *(n for n in lay.spans if n.startswith("key"))]
    return [i for n in names for i in range(*lay.spans[n])]


def _d_head(vocab: int) -> int:
    return SLOTS + 2 * vocab  # every head's QK: the positional part (SLOTS pairs) and two token parts (vocab each)


def _n_units(vocab: int, graded: int) -> int:
    return decoder.n_units([N_CTX, vocab], len(decoded(layout(vocab, graded))))


def _embed(p: Planter, s: Stream) -> None:
    """Raw codes only: each position and each token a signed one-hot code; the unembedding reads ``tok3``."""
    lay, vocab = p.lay, p.cfg.d_vocab
    for t in range(vocab):
        p.W_E[t, lay.idx("rawtok", t)] = _sign(s)
        p.W_U[lay.idx("tok3", t), t] = 1.0
    for i in range(N_CTX):
        p.W_pos[i, lay.idx("rawpos", i)] = _sign(s)


def _sign(s: Stream) -> float:
    return 1.0 if s.below(2) else -1.0


def _decoder(p: Planter, s: Stream, slots: list[list[int]]) -> None:
    """Block 0's MLP (tasks/head_roles/decoder.py): a position i decodes to ``pos`` i, to slot ``slots[g][i]`` of
    every graded head g's key copy, and half the constant; a token to its ``tok``, ``tok2`` and ``tok3`` features
    and the constant's other half. ``prev`` and each copy's spare slot ``slots[g][N_CTX]`` are decoded from nothing,
    so only the never-firing units and the firing units' cancelling parts write them."""
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
        rows(N_CTX, lambda i: [lay.idx("pos", i), *(lay.idx(f"key{g}", sl[i]) for g, sl in enumerate(slots))]),
    )
    tok = decoder.Kind(
        [(lay.idx("rawtok", t), float(p.W_E[t, lay.idx("rawtok", t)])) for t in range(p.cfg.d_vocab)],
        rows(p.cfg.d_vocab, lambda t: [lay.idx("tok", t), lay.idx("tok2", t), lay.idx("tok3", t)]),
    )
    decoder.plant(p, s, [pos, tok], features)


def _n_graded(n_heads: int) -> int:
    """Graded heads (blocks FIRST..), each with its own key copy."""
    return (N_LAYERS - FIRST) * n_heads


def config(level: str) -> HookedConfig:
    vocab, n_heads, _ = LEVELS[level]
    graded = _n_graded(n_heads)
    return HookedConfig(n_layers=N_LAYERS, n_heads=n_heads, d_model=layout(vocab, graded).size + 4,
                        d_head=_d_head(vocab), d_vocab=vocab, n_ctx=N_CTX, d_mlp=_n_units(vocab, graded),
                        attn_only=False)  # fmt: skip


def block0(p: Planter, s: Stream, slots: list[list[int]]) -> None:
    """The embeddings' raw codes and block 0's decoder, planted into ``p``."""
    _embed(p, s)
    _decoder(p, s, slots)


def _layer_roles(s: Stream, layer: int, n_heads: int) -> list[str]:
    """Every role the block can hold, then extra draws (so some role repeats), in a random order. Induction is
    planted once per model (its ``prev`` part is the one identity among the heads' token maps), so extras never
    draw it."""
    allowed = FIRST_ROLES if layer == FIRST else ROLES
    roles = list(allowed) + [s.pick(FIRST_ROLES) for _ in range(n_heads - len(allowed))]
    return [roles[i] for i in s.permutation(n_heads)]


def positional_part(role: str, offset: int) -> tuple[list[tuple[int, int | None]], int]:
    """Every head's positional part: each query position i paired with a key position (or with its copy's spare
    slot, None), and the key position the constant query is paired with; every pair positive, at the block's
    strength. It is one cyclic shift of the N_CTX positions, i -> i - d mod N_CTX, whose pair onto the constant's
    key moves to the spare slot, so every head has N_CTX - 1 pairs on decoded positions and the constant's on one:
    - an offset d (previous-token 1, local 2-3, none 4-6, duplicate-token HALF): the wrapped pairs (i < d) are
      causally masked, so inert; the constant reads the last position (live only for the last query);
    - attend-to-first: d = N_CTX - 1 (i -> i + 1, masked but for the last query, whose pair the constant takes):
      the constant reads position 0, the role;
    - induction: the same shift, the constant on the last position (the role is in its token part)."""
    shift, const_key = {"attend-to-first": (N_CTX - 1, 0), "induction": (N_CTX - 1, N_CTX - 1)}.get(
        role, (offset, N_CTX - 1)
    )
    pairs = [(i, None if (i - shift) % N_CTX == const_key else (i - shift) % N_CTX) for i in range(N_CTX)]
    return pairs, const_key


def _offset(s: Stream, role: str) -> int:
    """The positional shift of an offset role (0 for the others, whose shift positional_part fixes)."""
    if role in ("attend-to-first", "induction"):
        return 0
    return {"previous-token": 1, "duplicate-token": HALF}.get(role) or (
        2 + s.below(2) if role == "local" else s.pick(NONE_OFFSETS)
    )


def _cycle_power(order: list[int], k: int) -> list[int]:
    """The k-th power of the cycle that visits the tokens in ``order``: token order[i] -> order[i + k]."""
    n = len(order)
    out = [0] * n
    for i, t in enumerate(order):
        out[t] = order[(i + k) % n]
    return out


@dataclass
class Head:
    """What one graded head is planted with: ``g`` its key copy, ``slots`` where that copy holds each position (and
    its spare slot last), ``sigma`` / ``tau`` its token maps (``tok`` t -> ``prev`` sigma[t], ``tok2`` t -> ``tok``
    tau[t])."""

    g: int
    role: str
    slots: list[int]
    sigma: list[int]
    tau: list[int]


def _heads(s: Stream, roles: dict[tuple[int, int], str], vocab: int) -> dict[tuple[int, int], Head]:
    """Every graded head's key-copy order and token maps: powers of two random token cycles (one for ``prev``
    parts, one for ``tok`` parts), each power used by one head only and never the identity but for the induction
    head's ``prev`` part, so no two heads share a planted pair and no map but induction's fixes a token."""
    orders = [s.permutation(vocab), s.permutation(vocab)]
    powers = [[k + 1 for k in s.sample(vocab - 1, len(roles))] for _ in orders]
    out = {}
    for g, (head, role) in enumerate(roles.items()):
        sigma_k = 0 if role == "induction" else powers[0][g]
        out[head] = Head(g, role, s.permutation(SLOTS), _cycle_power(orders[0], sigma_k),
                         _cycle_power(orders[1], powers[1][g]))  # fmt: skip
    return out


def _plant(p: Planter, s: Stream, layer: int, head: int, plan: Head, st: float, gain: float, copies: bool) -> None:
    """One head: its positional part (positional_part) on its key copy, then two token parts that every head has,
    ``tok`` t against ``prev`` of sigma(t) (the identity for induction; in block 1, where ``prev`` is still zero,
    inert) and ``tok2`` t against ``tok`` of tau(t) (a sparse distractor on a token another token maps to). Every
    pair is positive at the block's strength on its own query and key dims, so every head's QK is one partial
    isometry times that strength: the same rank and singular values, and the same sums. OV: every head copies every
    token from ``tok3`` at the block's gain (block 1's copying head into ``prev``, the identity; block 1's other heads
    into ``scr``, permuted; block 2's into ``prev``, permuted, which nothing reads after them)."""
    lay = p.lay
    vocab = p.cfg.d_vocab
    pairs, const_key = positional_part(plan.role, _offset(s, plan.role))
    key = f"key{plan.g}"
    spare = plan.slots[N_CTX]
    qk = [(lay.idx("pos", i), lay.idx(key, spare if j is None else plan.slots[j]), st) for i, j in pairs]
    qk.append((lay.idx("const"), lay.idx(key, plan.slots[const_key]), st))
    qk += [(lay.idx("tok", t), lay.idx("prev", plan.sigma[t]), st) for t in range(vocab)]
    qk += [(lay.idx("tok2", t), lay.idx("tok", plan.tau[t]), st) for t in range(vocab)]
    p.qk(layer, head, [qk[i] for i in s.permutation(len(qk))])
    dst = list(range(vocab)) if copies else [int(v) for v in s.permutation(vocab)]
    space = "scr" if layer == FIRST and not copies else "prev"  # block 2's writes into prev are read by nothing
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
    cfg = config(level)
    lay = layout(vocab, _n_graded(n_heads))
    graded = range(FIRST, N_LAYERS)
    roles = {(layer, h): r for layer in graded for h, r in enumerate(_layer_roles(s, layer, n_heads))}
    # one QK strength and one OV gain per block, whatever its roles (every head's circuits then have one spectrum)
    strength = {layer: s.fraction(*STRENGTH) for layer in graded}
    gain = {layer: s.fraction(*GAIN) for layer in graded}
    while True:
        p = Planter(cfg, lay)
        plans = _heads(s, roles, vocab)
        block0(p, s, [plans[head].slots for head in roles])
        first_prev = min(h for (layer, h), r in roles.items() if layer == FIRST and r == "previous-token")
        for (layer, head), plan in plans.items():
            copies = (layer, head) == (FIRST, first_prev)
            _plant(p, s, layer, head, plan, strength[layer], gain[layer], copies)
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
