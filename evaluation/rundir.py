"""An eval run directory read back (``mechsandbox report``, ``/web/runs``), with one clear line for each way it can be
unusable: missing, not a directory, no or corrupt ``summary.json`` / ``results.jsonl``, a run of zero episodes.

The summary is the one ``mechsandbox eval`` wrote; a summary written before ``interval95`` existed is recomputed
from ``results.jsonl`` by the same ``report.summarise`` (so there is still one place that computes statistics).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROW_FIELDS = ("task_id", "level", "score", "steps")


class RunDirError(ValueError):
    """A run directory that cannot be reported on; the message is one line naming the path and the reason."""


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirError(f"{path}: unreadable ({exc.__class__.__name__})") from None
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


@dataclass
class RunDir:
    path: Path
    summary: dict[str, Any]
    rows: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return self.path.name

    def trajectories(self) -> Iterator[dict[str, Any]]:
        """Each episode's trajectory file, in the order the run played them; a corrupt file is skipped, counted in
        ``unreadable`` by the caller (a viewer shows the rest)."""
        folder = self.path / "trajectories"
        for file in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                data = json.loads(file.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                yield {"unreadable": file.name}
                continue
            if isinstance(data, dict):
                yield data
            else:
                yield {"unreadable": file.name}


def load_run(path: str | Path) -> RunDir:
    from .report import summarise

    folder = Path(path)
    if not folder.exists():
        raise RunDirError(f"{folder}: no such directory")
    if not folder.is_dir():
        raise RunDirError(f"{folder}: not a directory (give the folder `mechsandbox eval --out` wrote)")
    if not (folder / "summary.json").is_file():
        raise RunDirError(f"{folder}: no summary.json (not an eval run directory: `mechsandbox eval --out DIR`)")
    summary = _json(folder / "summary.json")
    if not isinstance(summary, dict) or not isinstance(summary.get("tasks"), dict) or "overall" not in summary:
        raise RunDirError(f"{folder / 'summary.json'}: not an eval summary (no tasks and overall)")
    rows = []
    results = folder / "results.jsonl"
    if not results.is_file():
        raise RunDirError(f"{folder}: no results.jsonl (the run's episodes)")
    for number, line in enumerate(results.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RunDirError(f"{results}: line {number} is not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or any(key not in row for key in ROW_FIELDS):
            raise RunDirError(f"{results}: line {number} lacks one of {', '.join(ROW_FIELDS)}")
        if not _valid_row(row):
            raise RunDirError(f"{results}: line {number} has a score outside [0, 1] (or a score beside an "
                              "infrastructure error), a negative or non-integer step count, or a task or level that "
                              "is not text")  # fmt: skip
        rows.append(row)
    if not rows:
        raise RunDirError(f"{folder}: the run has no episodes; nothing to report")
    run = summary.get("run") if isinstance(summary.get("run"), dict) else {}
    recomputed = summarise(rows, run)
    if "interval95" not in summary["overall"]:  # written before intervals were Wilson's: recompute, same code
        return RunDir(folder, recomputed, rows)
    for key in ("tasks", "overall", "infrastructure_errors"):
        if summary.get(key, 0) != recomputed[key]:
            raise RunDirError(f"{folder}: summary.json's {key} disagree with results.jsonl (edited or cut short?); "
                              "`mechsandbox eval` writes both together")  # fmt: skip
    return RunDir(folder, {**summary, "run": run}, rows)


def _valid_row(row: dict[str, Any]) -> bool:
    score, steps = row["score"], row["steps"]
    numeric = isinstance(score, (int, float)) and not isinstance(score, bool) and 0.0 <= score <= 1.0
    lost = row.get("infra_error")
    if lost is not None:  # lost to the infrastructure: no score, and the side that failed named
        numeric = score is None and isinstance(lost, dict) and isinstance(lost.get("side"), str)
    counted = isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0
    return numeric and counted and isinstance(row["task_id"], str) and isinstance(row["level"], str)


def run_folders(roots: tuple[str, ...] | list[str]) -> dict[str, Path]:
    """The run directories under the operator's roots (each a run, or a folder of runs one level down), by a unique
    name: the folder's name, then ``name-2``... Only these names are ever served: a request never names a path."""
    found: dict[str, Path] = {}
    for root in roots:
        base = Path(root)
        candidates = [base] if (base / "summary.json").is_file() else sorted(p for p in base.glob("*") if p.is_dir())
        for folder in candidates:
            if not (folder / "summary.json").is_file():
                continue
            name, k = folder.name, 2
            while name in found:
                name, k = f"{folder.name}-{k}", k + 1
            found[name] = folder
    return found
