"""Agents that play MechSandbox through its public API only (``client.py``): the scripted baseline
(each family's reference solution), the random baseline (docs/CONTRACT.md, "Baselines") and the LLM agent used by
``inference.py`` and ``mechsandbox eval --agent llm``."""

from .base import Agent, EpisodeRecord, play_episode
from .llm import LLMAgent
from .random_agent import RandomAgent
from .scripted import ScriptedAgent

__all__ = ["Agent", "EpisodeRecord", "LLMAgent", "RandomAgent", "ScriptedAgent", "play_episode"]
