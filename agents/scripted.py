"""The scripted baseline: play the family's reference snippets, then submit ``solution_from="answer"``.

The snippets (``tasks/<family>/reference.py``) derive the answer from the model's behaviour and
weights with generic methods (ablation sweeps, attention scores, DFT, regression, patching); they are
public code and contain no truth. The agent uses only the public API.
"""

from __future__ import annotations

from typing import Any

from .base import Agent, Turn


class ScriptedAgent(Agent):
    name = "scripted"

    def begin(self, obs: dict[str, Any]) -> None:
        from ..tasks import get_family  # here, not at import: ``mechsandbox.agents`` stays free of torch

        super().begin(obs)
        self.snippets = list(get_family(obs["task_id"]).reference)

    def next_turn(self, obs: dict[str, Any]) -> Turn:
        if self.snippets:
            return Turn({"python_code": self.snippets.pop(0)})
        return Turn({"solution_from": "answer"})

    def fallback_answer(self, obs: dict[str, Any]) -> dict[str, Any]:
        return {"solution_from": "answer"}
