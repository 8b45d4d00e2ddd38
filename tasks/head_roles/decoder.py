"""Block 0 of head-roles (version 4): an MLP that decodes the embeddings' raw codes into the features the heads
read, with no unit that writes one feature.

Why (issue 16): in version 3 every decoder unit fired on one code and wrote one feature, so W_out was the
feature basis up to duplication, and the *entries* of a head's circuit read in the unit basis (W_out QK W_out^T)
were its planted circuit: counting the large ones named the role (0.76-0.91 with a softmax regression).

How the decoding works. A kind is a set of codes of which every input holds exactly one (the position codes; the
token codes). Each of the kind's firing units reads ``READS`` of its codes, drawn so that every code is read by
``READ_BY`` units, with weight ``GAIN`` on each and bias ``-CUT``: it fires at exactly 1 on those codes and stays at
``-CUT`` on the others (incidence A: units x codes, full column rank). The writes F solve A^T F = T, where row c of
T is what code c must decode to (a position: its one-hot ``pos`` and ``pos2`` features and half the constant; a
token: its ``tok`` copies and the constant's other half), so the firing units of a code sum to its
features exactly. Among the solutions, F = pinv(A)^T T + a component in A's left null space (which every code's sum
cancels) drawn so that every unit carries the same expected mass on every feature: a unit's write is a dense
mixture, and which features it helps decode is readable only with A (from W_in: reading block 0 as the decoder it
is, which this family accepts).

Every firing unit has a partner reading the negated codes and writing the same vector (it never fires: the
MLP has no linear part), and never-firing pairs (each reading three codes of a kind with weight +-SILENT, which
reaches only SILENT - CUT < 0) complete the write map to an isometry (sum over units of
w w^T = gamma I on the decoded features), so a head's circuits read in the unit basis have its own spectra.

Known (a red team, 2026-12-04): the firing units' writes are shorter than the never-firing ones' (3.4-5.1 against
8.3-8.5 at head-roles 7 easy), so W_out alone tells which units fire; and since every firing unit reads READS codes,
the null-space parts of their writes cancel in their sum, which is the sum of every code's decoded features (any
incidence: weighting each unit by the codes it reads gives the same sum). Head-roles 6 read a head's QK on that
vector and summed its pairs' signs; version 7 makes every such sum one value for every head (all pairs positive,
equally many on decoded positions and tokens), so the sum names nothing. Accepted as interpretability (a red team on
version 7, evaluation/redteam_head_roles.py, 0.99 at every level; docs/TASKS.md says why: it reads the whole circuit
in the decoded basis): the filler is not hidden either. On the features its kind
does not decode, a firing unit writes only its filler, which lies in the left null space of its kind's incidence; the
other kind's features are findable from the weights (W_U and the copying head's writes; the heads' private key
spaces), so the firing rows restricted to them give each kind's null space exactly, and projecting it out leaves
every code's decoded features: block 0 decoded from W_out alone. What would make it harder (docs/TASKS.md): firing rows
that W_out cannot tell from the never-firing ones (equal norms needs a flat firing Gram, i.e. code targets whose
Gram matches the incidence's, and an equal-norm completion), so that finding them takes W_in, the decoding the
family accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..circuits import Planter
from ..rng import Stream

CUT = 1.5
GAIN = CUT + 1.0  # a firing unit's weight on each code it reads: it fires at exactly 1 there, stays at -CUT elsewhere
SILENT = 1.0  # a never-firing unit's weight on each of its three codes (below CUT: it reaches only SILENT - CUT)
READS, READ_BY = 2, 3  # codes a firing unit reads; firing units that read each code (the units fired per input)
SPARE = 1.05  # gamma over the firing units' largest eigenvalue (the completion has full rank)


@dataclass
class Kind:
    """Codes of which an input holds exactly one: ``codes[c]`` the raw residual dim of code c and its sign (the
    input holds sign * e_dim), ``targets[c]`` what it decodes to, a row over the decoded features."""

    codes: list[tuple[int, float]]
    targets: np.ndarray


def n_units(kinds_codes: list[int], n_features: int) -> int:
    """Units the decoder needs: a partner for each firing unit, and two never-firing units per feature."""
    return 2 * sum(_n_firing(n) for n in kinds_codes) + 2 * n_features


def _n_firing(n_codes: int) -> int:
    return n_codes * READ_BY // READS


def incidence(s: Stream, n_codes: int) -> np.ndarray:
    """Which codes each firing unit reads: READS distinct codes each, every code read by exactly READ_BY units (so
    no code's decoding needs larger writes than another's), full column rank."""
    n_units = _n_firing(n_codes)
    while True:
        slots = [c for c in range(n_codes) for _ in range(READ_BY)]
        slots = [slots[i] for i in s.permutation(len(slots))]
        a = np.zeros((n_units, n_codes))
        for u in range(n_units):
            a[u, slots[u * READS : (u + 1) * READS]] = 1.0
        if (a.sum(1) == READS).all() and np.linalg.matrix_rank(a) == n_codes:
            return a


def firing_writes(s: Stream, incid: list[np.ndarray], targets: list[np.ndarray]) -> list[np.ndarray]:
    """Each kind's writes F with A^T F = T, whose null-space part fills every feature column of every kind's units
    to one common expected mass per unit (the largest the exact parts need), so no column or kind stands out."""
    pinvs = [np.linalg.pinv(a) for a in incid]
    parts = [pinv.T @ t for pinv, t in zip(pinvs, targets, strict=True)]
    mass = max(float((p**2).sum(0).max()) / len(p) for p in parts)
    out = []
    for a, pinv, t, part in zip(incid, pinvs, targets, parts, strict=True):
        m, n = a.shape
        proj = np.eye(m) - a @ pinv  # onto A's left null space (rank m - n)
        var = np.maximum(mass * m - (part**2).sum(0), 0.0) / (m - n)
        out.append(part + proj @ (s.normal(m, t.shape[1]) * np.sqrt(var)))
    return out


def completion(s: Stream, firing: np.ndarray) -> np.ndarray:
    """Never-firing writes N (one row per unit, each used twice) with 2 F^T F + 2 N^T N = gamma I, gamma a little
    above the firing part's largest eigenvalue (so N has full rank)."""
    gram = 2.0 * firing.T @ firing
    gamma = SPARE * float(np.linalg.eigvalsh(gram)[-1])
    vals, vecs = np.linalg.eigh((gamma * np.eye(len(gram)) - gram) / 2.0)
    root = vecs @ np.diag(np.sqrt(np.maximum(vals, 0.0))) @ vecs.T
    return s.orthogonal(len(gram)) @ root


def plant(p: Planter, s: Stream, kinds: list[Kind], features: list[int]) -> None:
    """Write block 0's MLP into ``p``: the decoded ``features`` (residual dims) from ``kinds``."""
    incid = [incidence(s, len(k.codes)) for k in kinds]
    writes = firing_writes(s, incid, [k.targets for k in kinds])
    for kind, a, w in zip(kinds, incid, writes, strict=True):
        for u in range(len(a)):
            reads = [kind.codes[c] for c in np.flatnonzero(a[u])]
            for side in (1.0, -1.0):  # the unit and its partner
                _unit(p, [(dim, side * GAIN * sign) for dim, sign in reads], features, w[u])
    silent = completion(s, np.concatenate(writes))
    for row in silent:
        kind = kinds[s.below(len(kinds))]
        codes = [kind.codes[c] for c in s.sample(len(kind.codes), 3)]
        signs = [1.0 if s.below(2) else -1.0 for _ in codes]
        reads = [(dim, g * sign * SILENT) for (dim, sign), g in zip(codes, signs, strict=True)]
        for side in (1.0, -1.0):
            _unit(p, [(dim, side * w) for dim, w in reads], features, row)


def _unit(p: Planter, reads: list[tuple[int, float]], features: list[int], write: np.ndarray) -> None:
    u = p.mlp_used[0]
    p.mlp_unit(0, reads, -CUT, [])
    p.W_out[0, u, features] = write  # a dense row: one assignment, not a (dim, weight) pair per feature
