"""MechSandbox: a benchmark and RL environment for mechanistic-interpretability agents.

The repository root is this package (``mechsandbox``); the README's Layout section maps it.
"""

BENCHMARK_VERSION = "0.1.0"
__version__ = BENCHMARK_VERSION
