"""Eval outputs: ``results.jsonl``, ``trajectories/``, ``summary.json``, ``summary.md``, ``scores.png``.

Means come with a normal-approximation 95% interval (1.96·s/√n, 0 for one episode). The chart is drawn
with Pillow (already a dependency through OpenEnv), one group of bars per task, one bar per level, and
dashed markers for baseline runs passed with ``--compare``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from ..tasks import LEVELS

LEVEL_COLOURS = {"easy": (76, 146, 214), "medium": (240, 160, 60), "hard": (200, 70, 70)}
BASELINE_COLOURS = [(40, 40, 40), (120, 120, 120), (0, 130, 90)]


def stats(scores: list[float], steps: list[int]) -> dict[str, Any]:
    n = len(scores)
    mean = statistics.fmean(scores) if n else 0.0
    ci = 1.96 * statistics.stdev(scores) / math.sqrt(n) if n > 1 else 0.0
    return {"mean_score": round(mean, 4), "ci95": round(ci, 4), "episodes": n,
            "mean_steps": round(statistics.fmean(steps), 2) if steps else 0.0}  # fmt: skip


def summarise(rows: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    by_task: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
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
    overall = stats([r["score"] for r in rows], [r["steps"] for r in rows])
    return {"tasks": tasks, "overall": {k: overall[k] for k in ("mean_score", "ci95", "episodes")}, "run": run}


def markdown(summary: dict[str, Any]) -> str:
    run = summary["run"]
    lines = [
        f"# MechSandbox results: {run.get('agent')}" + (f" ({run['model']})" if run.get("model") else ""),
        "",
        f"benchmark {run.get('benchmark_version')} · split {run.get('split')} · commit {run.get('git_commit', '')[:10]}"
        f" · prompt {run.get('prompt_version') or '-'} · temperature {run.get('temperature', '-')}",
        "",
        "| task | version | " + " | ".join(LEVELS) + " | mean ± 95% CI | episodes | mean steps |",
        "|---|---|" + "---|" * len(LEVELS) + "---|---|---|",
    ]
    for task_id, t in sorted(summary["tasks"].items()):
        cells = [f"{t['levels'][lv]['mean_score']:.3f}" if lv in t["levels"] else "-" for lv in LEVELS]
        tail = f" | {t['mean_score']:.3f} ± {t['ci95']:.3f} | {t['episodes']} | {t['mean_steps']:.1f} |"
        lines.append(f"| {task_id} | {t['family_version']} | " + " | ".join(cells) + tail)
    o = summary["overall"]
    lines.append("| **overall** | | " + " | ".join("" for _ in LEVELS)
                 + f" | **{o['mean_score']:.3f} ± {o['ci95']:.3f}** | {o['episodes']} | |")  # fmt: skip
    return "\n".join(lines) + "\n"


def chart(summary: dict[str, Any], path: Path, baselines: dict[str, dict[str, Any]] | None = None) -> None:
    from PIL import Image, ImageDraw

    tasks = sorted(summary["tasks"])
    group, bar, left, top, height = 150, 38, 60, 50, 300
    width = left + group * max(len(tasks), 1) + 220
    img = Image.new("RGB", (width, top + height + 90), "white")
    d = ImageDraw.Draw(img)
    run = summary["run"]
    d.text(
        (left, 12), f"MechSandbox: {run.get('agent')} {run.get('model') or ''} (split {run.get('split')})", fill="black"
    )
    y = lambda v: top + height - int(v * height)  # noqa: E731
    for v in (0.0, 0.25, 0.5, 0.75, 1.0):
        d.line([(left - 5, y(v)), (left + group * len(tasks), y(v))], fill=(225, 225, 225))
        d.text((10, y(v) - 6), f"{v:.2f}", fill="black")
    for i, task_id in enumerate(tasks):
        x0 = left + i * group + 10
        for j, level in enumerate(LEVELS):
            entry = summary["tasks"][task_id]["levels"].get(level)
            if entry:
                xa = x0 + j * bar
                d.rectangle([xa, y(entry["mean_score"]), xa + bar - 6, y(0)], fill=LEVEL_COLOURS[level])
        for k, base in enumerate((baselines or {}).values()):
            t = base["tasks"].get(task_id)
            if t:
                colour = BASELINE_COLOURS[k % len(BASELINE_COLOURS)]
                for xs in range(x0 - 4, x0 + bar * len(LEVELS), 8):
                    d.line([(xs, y(t["mean_score"])), (xs + 4, y(t["mean_score"]))], fill=colour, width=2)
        d.text((x0, y(0) + 8), task_id[:22], fill="black")
    lx = left + group * len(tasks) + 20
    for j, level in enumerate(LEVELS):
        d.rectangle([lx, top + 20 * j, lx + 12, top + 20 * j + 12], fill=LEVEL_COLOURS[level])
        d.text((lx + 18, top + 20 * j), level, fill="black")
    for k, name in enumerate(baselines or {}):
        yy = top + 20 * (len(LEVELS) + k)
        d.line([(lx, yy + 6), (lx + 12, yy + 6)], fill=BASELINE_COLOURS[k % len(BASELINE_COLOURS)], width=2)
        d.text((lx + 18, yy), f"{name} (mean)", fill="black")
    img.save(path)


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
    chart(summary, out / "scores.png", baselines)
    return summary
