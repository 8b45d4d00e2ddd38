"""``AnswerKind``: how a grader reads an answer, named once for generators, graders, agents and tests.

Why a module of its own at the package root: the random agent and the evaluation code need the kinds
without importing ``mechsandbox.tasks`` (which loads torch and every family), and a bare string
such as ``"heads+roles"`` spelled in five places drifts. The enum is a ``StrEnum``, so it serialises
to exactly the strings the wire format and the artifacts have always carried (``"x-kind"`` in an
answer schema, ``"kind"`` in a truth record).
"""

from __future__ import annotations

from enum import StrEnum


class AnswerKind(StrEnum):
    INDICES = "indices"  # a set of unit or input indices
    FREQUENCIES = "frequencies"  # a set of Fourier frequencies in 1..(p-1)/2
    HEADS = "heads"  # a set of [layer, head] pairs
    HEADS_ROLES = "heads+roles"  # a set of heads, each with a role label
    ROLES = "roles"  # a role label for every head
    BASIS = "basis"  # basis vectors of a subspace
    CELL = "cell"  # one (layer, position) cell
    FEATURES_GROUPS = "features+groups"  # represented features and the groups that share dimensions

    @property
    def is_set(self) -> bool:
        """Graded as a set by the Jaccard index (the seed-variation and constant-answer rules apply)."""
        return self in _SET_KINDS

    @property
    def names_heads(self) -> bool:
        return self in (AnswerKind.HEADS, AnswerKind.HEADS_ROLES)


_SET_KINDS = frozenset({AnswerKind.INDICES, AnswerKind.FREQUENCIES, AnswerKind.HEADS, AnswerKind.HEADS_ROLES})
