"""MechSandbox: a benchmark and RL environment for mechanistic-interpretability agents.

The repository root is this package (``mechsandbox``); see DESIGN in the README.
"""

BENCHMARK_VERSION = "0.1.0"
__version__ = BENCHMARK_VERSION
