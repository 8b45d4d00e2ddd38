"""Eval outputs: ``results.jsonl``, ``trajectories/``, ``summary.json``, ``summary.md`` and the figures
(``scores``, ``levels``, ``steps`` as SVG and PNG: ``figures.py``).

Every statistic is computed here, once, and written to ``summary.json``; the CLI's table, the figures and the run
viewer (``mechsandbox report``, ``/web/runs``) only read it. Each mean comes with ``interval95``, Wilson's 95% score
interval on the mean score (as the leaderboard's: conservative for scores in [0, 1], never zero-width at the 0.99 cap,
wide at small n), and ``ci95``, the normal approximation's half-width (1.96 s / sqrt(n), 0 for one episode), kept for
readers of older summaries.

Episodes the infrastructure lost (a row with ``infra_error``, no score) are in no mean and no ``episodes`` count:
every ``episodes`` is the n of its mean. They are counted apart, as ``infrastructure_errors`` (with
``infrastructure_by_side`` and ``infrastructure_by_task``) at the top of ``summary.json``, in the first line of
``summary.md`` and in the CLI's final line, so a run that lost episodes can never pass for a complete one.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..results.leaderboard import wilson_interval
from ..tasks import LEVELS
from .figures import SOLVED_SCORE, run_levels, write_figures


def stats(scores: list[float], steps: list[int]) -> dict[str, Any]:
    n = len(scores)
    mean = statistics.fmean(scores) if n else 0.0
    ci = 1.96 * statistics.stdev(scores) / math.sqrt(n) if n > 1 else 0.0
    return {"mean_score": round(mean, 4), "interval95": list(wilson_interval(mean, n)), "ci95": round(ci, 4),
            "episodes": n, "solved": sum(score >= SOLVED_SCORE for score in scores),
            "mean_steps": round(statistics.fmean(steps), 2) if steps else 0.0}  # fmt: skip


def sealed_line(summary: dict[str, Any]) -> str:
    """The line that says a run's counted attempts were sealed, with the run's published result when it has one."""
    count = summary.get("sealed_episodes", 0)
    if not count:
        return ""
    published = (summary.get("run") or {}).get("published") or {}
    result = ""
    if published.get("overall") is not None:
        result = f"; the run's published result: overall {published['overall']}"
        if published.get("ci95"):
            result += f" {list(published['ci95'])}"
    return (f"{count} sealed counted attempt{'s' if count != 1 else ''}: scored by the server, shown only in the run's "
            f"published result, so they are in no mean here{result}")


def interval_text(entry: dict[str, Any]) -> str:
    """``0.990 [0.935, 1.000]``: how the table, the CLI and the pages print a mean with its interval."""
    low, high = entry["interval95"]
    return f"{entry['mean_score']:.3f} [{low:.3f}, {high:.3f}]"


def is_infra(row: dict[str, Any]) -> bool:
    """Whether a results row is an episode the infrastructure lost (no score; in no mean)."""
    return bool(row.get("infra_error"))


def has_score(row: dict[str, Any]) -> bool:
    """Whether a results row belongs in a mean: not lost to the infrastructure, not a sealed counted attempt (its score
    shows only in the run's published result, ``run.published``)."""
    return not is_infra(row) and not row.get("sealed")


def infrastructure_counts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The infrastructure errors among ``rows``: their number, by side and by family (each dict sorted)."""
    lost = [row for row in rows if is_infra(row)]
    sides: dict[str, int] = defaultdict(int)
    tasks: dict[str, int] = defaultdict(int)
    for row in lost:
        sides[str(row["infra_error"].get("side", "server"))] += 1
        tasks[row["task_id"]] += 1
    return {"infrastructure_errors": len(lost), "infrastructure_by_side": dict(sorted(sides.items())),
            "infrastructure_by_task": dict(sorted(tasks.items()))}  # fmt: skip


def infrastructure_line(summary: dict[str, Any]) -> str:
    """The one line that says a run lost episodes to the infrastructure ("" when it lost none)."""
    count = summary.get("infrastructure_errors", 0)
    if not count:
        return ""
    sides = ", ".join(f"{side} {n}" for side, n in summary.get("infrastructure_by_side", {}).items())
    return (f"{count} infrastructure error{'s' if count != 1 else ''} ({sides}): those episodes have no score and are "
            f"in no mean; the means are over the {summary['overall']['episodes']} graded episodes")  # fmt: skip


def summarise(rows: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    by_task: dict[str, list[dict]] = defaultdict(list)
    graded = [row for row in rows if has_score(row)]
    for row in graded:
        by_task[row["task_id"]].append(row)
    tasks = {}
    for task_id, items in by_task.items():
        levels = {}
        for level in LEVELS:
            sel = [r for r in items if r["level"] == level]
            if sel:
                levels[level] = stats([r["score"] for r in sel], [r["steps"] for r in sel])
        entry = stats([r["score"] for r in items], [r["steps"] for r in items])
        entry["family_version"] = items[0].get("family_version", "")
        entry["levels"] = levels
        tasks[task_id] = entry
    overall = stats([r["score"] for r in graded], [r["steps"] for r in graded])
    keys = ("mean_score", "interval95", "ci95", "episodes", "solved")
    return {"tasks": tasks, "overall": {k: overall[k] for k in keys}, **infrastructure_counts(rows),
            "sealed_episodes": sum(1 for row in rows if row.get("sealed") and not is_infra(row)), "run": run}


def markdown(summary: dict[str, Any]) -> str:
    run = summary["run"]
    levels = run_levels(summary)
    lines = [
        f"# MechSandbox results: {run.get('agent')}" + (f" ({run['model']})" if run.get("model") else ""),
        "",
        *([f"**{infrastructure_line(summary)}**", ""] if infrastructure_line(summary) else []),
        *([f"{sealed_line(summary)}", ""] if sealed_line(summary) else []),
        f"benchmark {run.get('benchmark_version')} · split {run.get('split')} · commit {run.get('git_commit', '')[:10]}"
        f" · prompt {run.get('prompt_version') or '-'} · temperature {run.get('temperature', '-')}",
        "",
        "| task | version | " + " | ".join(levels) + " | mean [95% interval] | episodes | solved | mean steps |",
        "|---|---|" + "---|" * len(levels) + "---|---|---|---|",
    ]
    for task_id, t in sorted(summary["tasks"].items()):
        cells = [f"{t['levels'][lv]['mean_score']:.3f}" if lv in t["levels"] else "-" for lv in levels]
        tail = f" | {interval_text(t)} | {t['episodes']} | {t['solved']} | {t['mean_steps']:.1f} |"
        lines.append(f"| {task_id} | {t['family_version']} | " + " | ".join(cells) + tail)
    o = summary["overall"]
    lines.append("| **overall** | | " + " | ".join("" for _ in levels)
                 + f" | **{interval_text(o)}** | {o['episodes']} | {o['solved']} | |")  # fmt: skip
    return "\n".join(lines) + "\n"


def write_all(out: Path, records: list[Any], run: dict[str, Any], baselines: dict[str, dict] | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / "trajectories").mkdir(exist_ok=True)
    rows = [r.result_row() for r in records]
    with open(out / "results.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    for i, record in enumerate(records):
        name = f"{i:05d}-{record.task_id}-{record.level}.json"
        (out / "trajectories" / name).write_text(json.dumps(record.trajectory(), indent=1))
    summary = summarise(rows, run)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(markdown(summary))
    write_figures(summary, rows, out, baselines)
    return summary
