"""Decoy writers: heads shaped like a planted writer in every weight reading, but inert on the data.

Why: a planted head that writes token identities into the space the unembedding reads (a copy head, a
committee member) is named by any composed reading of the weights -- ||W_E W_V W_O W_U||_F, its rank, its
singular values -- when it is the only head that writes there and the distractors write into scratch space
that nothing reads (issue 16: that norm named copy-head's copy head in 0.99 of the seeds). Matching the
distractors' own statistics does not help, because the leak is *where* the planted head writes.

A decoy writer has the writer's OV circuit -- the identities of n tokens into the output subspace at the same
gain, so the same norm, rank and singular-value profile of W_E W_OV W_U -- and a QK circuit of an ordinary
head, but on the data it attends only to keys that carry none of the tokens it copies:

- it attends to residual features (a flag such as "marked", or a union of token-subset flags) whose
  tokens are disjoint from the ones it copies, so what it reads, it does not copy (:func:`plant_flag_decoy`);
- or it attends to a position whose token never belongs to its copied set on the data distribution (its
  own position, when the copied tokens never stand at the query position: :func:`plant_offset_decoy`);
- or it is the writer itself, attending to what it copies, but only from positions whose output nothing reads (every
  position but the last, where the logits are read: :func:`plant_blind_writer`). Why this kind too: the first two
  use the writer's features on one side only (what it attends to, or what it copies), so the subspace that the
  writer and all its decoys share most holds the features the writer uses on *both* sides, and stripping it
  (``evaluation.shortcuts.shared_subspaces``) left the writer the one head whose two circuits both shrank
  (copy-head 4: 0.50-0.84 in the shortcut audit).

Its inertness is a property of the QK x OV interaction and of the data, which no linear reading of either
circuit shows: telling the decoys from the writer takes an intervention (ablation, patching) or reading
both circuits against the data. A family plants decoys with the same draws (strength, gain, number of
copied tokens) as its writer, so each statistic of the writer's circuits is shared by the decoys, and
checks the decoys' ablation effects in its acceptance test (a decoy leaks a little where its attention
is not saturated, e.g. a flag decoy on a sequence without a flagged token).
"""

from __future__ import annotations

from .circuits import Planter, attend_offset, attend_spread, copy_tokens


def tokens_with(p: Planter, dim: int) -> set[int]:
    """The tokens whose embedding carries the (unrotated) residual dim ``dim``."""
    return {t for t in range(p.cfg.d_vocab) if p.W_E[t, dim] != 0.0}


def plant_flag_decoy(
    p: Planter,
    layer: int,
    head: int,
    key_dims: list[int],
    strength: float,
    tokens: list[int],
    dst: str,
    gain: float,
    dst_offsets: list[int] | None = None,
    query: list[tuple[int, float]] | None = None,
) -> None:
    """A head that attends from the positions its ``query`` reads ((dim, weight) pairs; default: the ``const``
    feature, so every position) to keys carrying any of ``key_dims`` and writes the identities of ``tokens`` into
    ``dst`` (the QK and OV of a content copy head). One head dimension holds the QK (:func:`circuits.attend_spread`),
    so it has rank 1 and singular value ``strength`` however many features it reads: several key features widen what
    the head reads, so some key carries one on (almost) every sequence. Raises if a copied token carries a key
    feature: then the head would copy what it reads, and be a writer, not a decoy. (No token carries a positional
    dim; for those the caller vouches for the tokens standing there.)"""
    overlap = sorted(set().union(*(tokens_with(p, k) for k in key_dims)) & set(tokens))
    if overlap:
        raise ValueError(f"a decoy that copies tokens {overlap} it attends to is not inert")
    attend_spread(p, layer, head, query or [(p.lay.idx("const"), 1.0)], key_dims, strength)
    copy_tokens(p, layer, head, tokens, dst, gain, dst_offsets)


def plant_offset_decoy(
    p: Planter,
    layer: int,
    head: int,
    offset: int,
    strength: float,
    tokens: list[int],
    dst: str,
    gain: float,
    dst_offsets: list[int] | None = None,
) -> None:
    """A head that attends from position i to i - ``offset`` and writes the identities of ``tokens`` into
    ``dst``. Inert only where the data never puts a copied token at the attended position of the positions
    whose output is read (the caller's claim: e.g. offset 0 and tokens that never stand last)."""
    attend_offset(p, layer, head, offset, strength)
    copy_tokens(p, layer, head, tokens, dst, gain, dst_offsets)


def plant_blind_writer(
    p: Planter,
    layer: int,
    head: int,
    query: list[tuple[int, float]],
    key_dims: list[int],
    strength: float,
    tokens: list[int],
    dst: str,
    gain: float,
) -> None:
    """A head with a content writer's QK and OV that does copy what it attends to, but only from the positions its
    ``query`` gives a score ((dim, weight) pairs, :func:`circuits.attend_spread`). Inert where the positions whose
    output is read get none (the caller's claim: e.g. the query reads const - pos[last]): there the head attends
    evenly, so it writes about gain / (position + 1) of each copied token it sees, a share the caller's acceptance
    bounds."""
    attend_spread(p, layer, head, query, key_dims, strength)
    copy_tokens(p, layer, head, tokens, dst, gain)
