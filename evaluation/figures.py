"""The figures of an eval run, drawn with matplotlib from ``summary.json`` and ``results.jsonl`` alone.

Three figures, each written as SVG (for papers and the run viewer, which inlines it) and as PNG at 200 dpi:
- ``scores``: per family, the mean score over every level run, with its 95% interval (the summary's ``interval95``:
  Wilson's score interval on the mean, which stays inside [0, 1], is not zero-width at the 0.99 cap and is wide at
  small n), the number of episodes written beside each bar, and each baseline run's mean as a reference mark;
- ``levels``: the same, one panel per level that was run (a level nobody ran gets no panel and no legend entry);
- ``steps``: steps to solve, per family: each solved episode (score >= ``SOLVED_SCORE``) as a dot, their median as a
  bar, and how many of the family's episodes were solved.

Why horizontal bars: family names are long (``causal-subspace``, ``committee-circuit``) and are printed whole on
the y axis; a vertical chart would cut or rotate them. Nothing here computes a statistic the summary does not hold,
so a figure, the CLI's table and the run viewer always agree (issue 22).
"""

from __future__ import annotations

import io
import statistics
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SOLVED_SCORE = 0.95  # the reference solutions' bar (docs/TASKS.md): an episode at or above it is "solved"
LEVEL_COLOURS = {"easy": "#4c92d6", "medium": "#f0a03c", "hard": "#c84646"}
ALL_COLOUR = "#4a6fa5"
BASELINE_MARKERS = ("D", "s", "^", "v", "P")
BASELINE_COLOURS = ("#222222", "#7a7a7a", "#00825a", "#8a3ffc", "#b8860b")
FORMATS = ("svg", "png")
DPI = 200


DRAWING = threading.Lock()  # matplotlib's rcParams are global: one figure is saved at a time (server threads)


def _figure(width: float, height: float) -> Any:
    """A Figure without pyplot: no global figure registry, no GUI backend, nothing to close (the server draws in
    worker threads)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def _title(summary: Mapping[str, Any]) -> str:
    run = summary.get("run", {})
    who = str(run.get("agent") or "agent") + (f" ({run['model']})" if run.get("model") else "")
    lost = summary.get("infrastructure_errors", 0)
    tail = f" (+{lost} lost to the infrastructure, in no mean)" if lost else ""
    return f"MechSandbox: {who}, split {run.get('split', '?')}, {summary['overall']['episodes']} episodes{tail}"


def _bars(ax: Any, entries: list[tuple[str, Mapping[str, Any]]], colour: str,
          baselines: Mapping[str, list[float | None]]) -> None:  # fmt: skip
    """Horizontal bars with interval whiskers and ``n = ..`` labels; baselines as markers on each row."""
    names = [name for name, _ in entries]
    y = list(range(len(entries)))[::-1]
    means = [e["mean_score"] for _, e in entries]
    low = [e["mean_score"] - e["interval95"][0] for _, e in entries]
    high = [e["interval95"][1] - e["mean_score"] for _, e in entries]
    ax.barh(y, means, color=colour, height=0.62, zorder=2)
    ax.errorbar(means, y, xerr=[low, high], fmt="none", ecolor="black", elinewidth=1.1, capsize=3, zorder=3)
    for yy, (_, e) in zip(y, entries, strict=True):
        ax.text(1.02, yy, f"n = {e['episodes']}", va="center", fontsize=8, transform=ax.get_yaxis_transform())
    for k, (label, values) in enumerate(baselines.items()):
        points = [(v, yy) for v, yy in zip(values, y, strict=True) if v is not None]
        if points:
            ax.scatter([p[0] for p in points], [p[1] for p in points], marker=BASELINE_MARKERS[k % 5], s=28,
                       color=BASELINE_COLOURS[k % 5], zorder=4, label=f"baseline: {label}")  # fmt: skip
    ax.set_yticks(y, names)
    ax.set_xlim(0, 1)
    ax.grid(axis="x", color="#dddddd", zorder=0)
    ax.set_axisbelow(True)


def _baseline_means(baselines: Mapping[str, Mapping[str, Any]], families: list[str],
                    level: str | None = None) -> dict[str, list[float | None]]:  # fmt: skip
    out: dict[str, list[float | None]] = {}
    for label, base in baselines.items():
        row: list[float | None] = []
        for family in families:
            entry = base.get("tasks", {}).get(family)
            if entry is not None and level is not None:
                entry = entry.get("levels", {}).get(level)
            row.append(entry["mean_score"] if entry else None)
        out[label] = row
    return out


def run_levels(summary: Mapping[str, Any]) -> list[str]:
    """The levels some family of the run played, in the order easy, medium, hard."""
    from ..tasks import LEVELS

    played = {level for entry in summary["tasks"].values() for level in entry["levels"]}
    return [level for level in LEVELS if level in played]


def scores_figure(summary: Mapping[str, Any], baselines: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    families = sorted(summary["tasks"])
    fig = _figure(7.5, 0.45 * len(families) + 1.6)
    ax = fig.subplots()
    _bars(ax, [(f, summary["tasks"][f]) for f in families], ALL_COLOUR, _baseline_means(baselines or {}, families))
    ax.set_xlabel(f"mean score over levels {', '.join(run_levels(summary))} (whiskers: 95% Wilson interval)")
    ax.set_title(_title(summary), fontsize=10)
    if baselines:
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def levels_figure(summary: Mapping[str, Any], baselines: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    families = sorted(summary["tasks"])
    levels = run_levels(summary)
    fig = _figure(4.2 * len(levels) + 1.5, 0.45 * len(families) + 1.8)
    axes = fig.subplots(1, len(levels), sharey=True, squeeze=False)
    for ax, level in zip(axes[0], levels, strict=True):
        entries = [(f, summary["tasks"][f]["levels"][level]) for f in families
                   if level in summary["tasks"][f]["levels"]]  # fmt: skip
        played = {name for name, _ in entries}
        _bars(ax, entries, LEVEL_COLOURS[level], _baseline_means(baselines or {}, [n for n, _ in entries], level))
        ax.set_title(f"{level} ({sum(e['episodes'] for _, e in entries)} episodes)", fontsize=10)
        ax.set_xlabel("mean score (95% Wilson interval)", fontsize=8)
        missing = [f for f in families if f not in played]
        if missing:
            ax.text(0.5, -0.25, f"not run: {', '.join(missing)}", fontsize=7, ha="center", transform=ax.transAxes)
    fig.suptitle(_title(summary), fontsize=10)
    if baselines:
        axes[0][0].legend(loc="lower left", fontsize=7)
    fig.tight_layout()
    return fig


def steps_figure(summary: Mapping[str, Any], rows: Iterable[Mapping[str, Any]]) -> Any:
    families = sorted(summary["tasks"])
    solved: dict[str, list[int]] = {f: [] for f in families}
    total = dict.fromkeys(families, 0)
    for row in rows:
        if row["task_id"] in total and row.get("score") is not None:  # lost or sealed: neither solved nor not
            total[row["task_id"]] += 1
            if row["score"] >= SOLVED_SCORE:
                solved[row["task_id"]].append(int(row["steps"]))
    fig = _figure(7.5, 0.45 * len(families) + 1.6)
    ax = fig.subplots()
    y = list(range(len(families)))[::-1]
    for yy, family in zip(y, families, strict=True):
        steps = sorted(solved[family])
        if steps:
            ax.barh(yy, statistics.median(steps), color="#9bbbe0", height=0.6, zorder=2)
            ax.scatter(steps, [yy] * len(steps), s=12, color="#1f3b63", zorder=3, alpha=0.7)
        ax.text(1.01, yy, f"{len(steps)} of {total[family]} solved", va="center", fontsize=8,
                transform=ax.get_yaxis_transform())  # fmt: skip
    ax.set_yticks(y, families)
    ax.set_xlim(left=0)
    ax.set_xlabel(f"steps to solve (dots: episodes scoring >= {SOLVED_SCORE}; bar: their median)")
    ax.set_title(_title(summary), fontsize=10)
    ax.grid(axis="x", color="#dddddd", zorder=0)
    fig.tight_layout()
    return fig


def _save(fig: Any, target: Any, fmt: str) -> None:
    """Save with fixed ids and no date in the SVG, so the same run draws byte-identical files."""
    import matplotlib

    with DRAWING, matplotlib.rc_context({"svg.hashsalt": "mechsandbox"}):
        fig.savefig(target, format=fmt, dpi=DPI, metadata={"Date": None} if fmt == "svg" else None)


def svg_text(fig: Any) -> str:
    """The figure as an SVG document (the run viewer embeds it)."""
    buffer = io.StringIO()
    _save(fig, buffer, "svg")
    return buffer.getvalue()


NAMES = ("scores", "levels", "steps")


def draw(name: str, summary: Mapping[str, Any], rows: Iterable[Mapping[str, Any]],
         baselines: Mapping[str, Mapping[str, Any]] | None = None) -> Any:  # fmt: skip
    """One of ``NAMES`` as a Figure."""
    if name == "steps":
        return steps_figure(summary, rows)
    return {"scores": scores_figure, "levels": levels_figure}[name](summary, baselines)


def write_figures(summary: Mapping[str, Any], rows: list[Mapping[str, Any]], out: Path,
                  baselines: Mapping[str, Mapping[str, Any]] | None = None) -> list[Path]:  # fmt: skip
    """scores, levels and steps as SVG and 200-dpi PNG in ``out``; returns the paths written (none when no episode
    was graded: every one was lost to the infrastructure, and there is no score to draw)."""
    written: list[Path] = []
    if not summary["tasks"]:
        return written
    for name in NAMES:
        fig = draw(name, summary, rows, baselines)
        for fmt in FORMATS:
            path = out / f"{name}.{fmt}"
            _save(fig, path, fmt)
            written.append(path)
    return written
