"""The random baseline (docs/CONTRACT.md, "Baselines"): a few well-formed snippets, then a uniformly random answer.

It reads only the instance's ``answer_schema``: the answer size is drawn uniformly from
1..min(N, 2·k_max) (never told |G|), items uniformly from the universe, roles uniformly from the
listed roles. It gives the chance level that a real agent must beat.
"""

from __future__ import annotations

import random
from typing import Any

from ..answer_kind import AnswerKind
from .base import Agent, Turn

PROBES = ("print(model)", "print(sorted(n for n, _ in model.named_parameters())[:5])")


class RandomAgent(Agent):
    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.rng = random.Random(seed)

    def begin(self, obs: dict[str, Any]) -> None:
        """Draws are re-seeded per episode from the agent's seed and the instance (its id, or task and level), so a
        run's scores do not depend on which worker of a concurrent evaluation plays which episode."""
        super().begin(obs)
        self.probes = list(PROBES)
        instance = obs.get("instance_id") or f"{obs.get('task_id')}/{obs.get('level')}"
        self.rng = random.Random(f"{self.seed}:{instance}")

    def next_turn(self, obs: dict[str, Any]) -> Turn:
        if self.probes:
            return Turn({"python_code": self.probes.pop(0)})
        return Turn({"solution_target": self.random_answer(self.reset_obs["answer_schema"])})

    def fallback_answer(self, obs: dict[str, Any]) -> dict[str, Any]:
        return {"solution_target": self.random_answer(self.reset_obs["answer_schema"])}

    def random_answer(self, schema: dict[str, Any]) -> Any:
        kind = AnswerKind(schema["x-kind"])
        if kind is AnswerKind.CELL:
            return {
                "layer": self.rng.randrange(int(schema["x-n-layers"])),
                "position": self.rng.randrange(int(schema["x-n-positions"])),
            }
        if kind is AnswerKind.ROLES:  # a label for every head
            layers, heads = int(schema["x-n-layers"]), int(schema["x-n-heads"])
            first = int(schema.get("x-first-layer", 0))  # head-roles 3: block 0 has no graded heads
            graded = [(lay, h) for lay in range(first, layers) for h in range(heads)]
            return {f"L{lay}H{h}": self.rng.choice(schema["x-roles"]) for lay, h in graded}
        if kind is AnswerKind.BASIS:  # a few random Gaussian directions
            d = int(schema["x-dim"])
            rows = self.rng.randint(1, min(d, 2 * int(schema["x-k-max"])))
            return [[round(self.rng.gauss(0.0, 1.0), 6) for _ in range(d)] for _ in range(rows)]
        if kind is AnswerKind.FEATURES_GROUPS:  # a random subset, then random groups of 2-3 of its members
            n = int(schema["x-universe"])
            represented = sorted(self.rng.sample(range(n), self.rng.randint(1, n)))
            pool, groups = self.rng.sample(represented, len(represented)), []
            while len(pool) >= 2 and self.rng.random() < 0.7:
                size = min(len(pool), self.rng.choice((2, 3)))
                groups.append(sorted(pool[:size]))
                pool = pool[size:]
            return {"represented": represented, "groups": groups}
        n, k_max = int(schema["x-universe"]), int(schema["x-k-max"])
        size = self.rng.randint(1, min(n, 2 * k_max))
        picks = self.rng.sample(range(n), size)
        if kind.names_heads:
            n_heads = int(schema["x-n-heads"])
            heads = [[p // n_heads, p % n_heads] for p in picks]
            if kind is AnswerKind.HEADS_ROLES:
                roles = schema["x-roles"]
                return {"heads": heads, "roles": {f"L{h[0]}H{h[1]}": self.rng.choice(roles) for h in heads}}
            return heads
        first = int(schema.get("items", {}).get("minimum", 0))
        return [first + p for p in picks]
