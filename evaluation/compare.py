"""Which instances a run played, and whether two runs can be drawn side by side (``--compare``).

Why: a mean over other instances is another number. Two test-split runs are comparable only when they played the
same instances, which means the same salt (its fingerprint names it) and the same (task, level, index) picks; two
train runs, the same (task, level, seed) picks. ``summary.json`` records both, and ``--compare`` refuses a
baseline that differs, or, with ``--force-compare``, says exactly how it differs and draws it anyway.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any


def instance_keys(resets: Iterable[dict[str, Any]]) -> list[str]:
    """``task/level/test:index`` or ``task/level/train:seed`` for each planned reset, sorted."""
    keys = []
    for reset in resets:
        pick = f"test:{reset['index']}" if reset["split"] == "test" else f"train:{reset['seed']}"
        keys.append(f"{reset['task_id']}/{reset['level']}/{pick}")
    return sorted(keys)


def _examples(keys: set[str]) -> str:
    shown = ", ".join(sorted(keys)[:3])
    return shown + (", ..." if len(keys) > 3 else "")


def difference(run: dict[str, Any], this: dict[str, Any]) -> str | None:
    """Why the baseline ``run`` played other instances than ``this`` run (both: a summary's ``run`` object, with
    ``split``, ``salt_fingerprint``, ``benchmark_version``, ``family_versions`` and ``instances``); None if not.

    Versions matter as much as the picks: after a generator change the same (task, level, index) is another model.
    """
    split, fingerprint, keys = this["split"], this.get("salt_fingerprint"), this["instances"]
    if "instances" not in run or "family_versions" not in run:
        return "it records no instance set and versions (made before runs recorded them); rerun it"
    if run.get("benchmark_version") != this.get("benchmark_version"):
        return f"it played benchmark {run.get('benchmark_version')}, this run {this.get('benchmark_version')}"
    changed = sorted(t for t in set(run["family_versions"]) & set(this.get("family_versions", {}))
                     if run["family_versions"][t] != this["family_versions"][t])  # fmt: skip
    if changed:
        return "other family versions: " + ", ".join(
            f"{t} {run['family_versions'][t]} vs {this['family_versions'][t]}" for t in changed
        )
    if run.get("split") != split:
        return f"it played the {run.get('split')} split, this run the {split} split"
    if split == "test" and run.get("salt_fingerprint") != fingerprint:
        return (f"it played another test set (salt fingerprint {run.get('salt_fingerprint')}, this run "
                f"{fingerprint}): a server with a random salt draws new instances each time it starts")  # fmt: skip
    theirs, ours = set(run["instances"]), set(keys)
    if theirs != ours:
        parts = []
        if ours - theirs:
            parts.append(f"{len(ours - theirs)} instances only in this run ({_examples(ours - theirs)})")
        if theirs - ours:
            parts.append(f"{len(theirs - ours)} only in it ({_examples(theirs - ours)})")
        return "; ".join(parts)
    return None


def compare_refusal(baselines: dict[str, dict], info: dict, forced: bool, prog: str = "mechsandbox eval") -> str | None:
    """The message that refuses ``--compare`` baselines played on other instances (None: all comparable).

    With ``--force-compare`` the differences are printed as a warning and nothing is refused.
    """
    problems = []
    for where, data in baselines.items():
        why = difference(data.get("run", {}), info)
        if why:
            problems.append(f"--compare {where}: {why}")
    if not problems:
        return None
    if forced:
        for line in problems:
            print(f"{prog}: warning (--force-compare): {line}", file=sys.stderr)
        return None
    return f"{prog}: refusing to compare runs on different instances:\n  " + "\n  ".join(problems) + (
        "\n(--force-compare draws them anyway)"
    )
