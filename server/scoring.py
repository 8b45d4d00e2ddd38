"""How the end of an episode is scored and recorded (``Scoring``), shared by ``episode.py`` and ``runs.py``.

Kept apart so the episode rules need not import the results database, and the run logic need not import
the episode rules' internals.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import protocol

CODE_KEEP = 4000  # characters of each action and output kept in a stored trajectory


@dataclass
class Scoring:
    """How the end of one episode is scored and recorded.

    ``open``: scored and rewarded as always (train episodes; run-less test episodes on a random-salt server).
    ``counted``: the run's attempt at this instance; recorded in the results database; reward = score on a
    random-salt server, the floor when ``sealed`` (a fixed salt: the score shows only in the run's published aggregates
    once it is finished, so no number of runs makes the reward an oracle).
    ``uncounted``: a later episode of an instance the run already attempted; ``practice``: a run-less test
    episode on a fixed-salt server with practice on. Both are played, graded for validity, and shown the floor.
    """

    mode: str = "open"
    run_id: str | None = None
    attempt_id: int | None = None
    reason: str = ""
    sealed: bool = False  # a counted attempt on a fixed-salt server: recorded, but shown the floor (issue 55)

    @property
    def counted(self) -> bool | None:
        return None if self.mode == "open" else self.mode == "counted"

    @property
    def hides_score(self) -> bool:
        return self.mode in ("uncounted", "practice") or (self.mode == "counted" and self.sealed)


def clip(text: str, keep: int = CODE_KEEP) -> str:
    """``text`` cut to ``keep`` characters (``CODE_KEEP`` by default), saying how many were dropped."""
    return protocol.clip(text, keep)
