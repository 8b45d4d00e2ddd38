"""An eval run directory read back (``mechsandbox report``, ``/web/runs``), with one clear line for each way it can be
unusable: missing, not a directory, no or corrupt ``summary.json`` / ``results.jsonl``, a run of zero episodes.

The summary is the one ``mechsandbox eval`` wrote; a summary written before ``interval95`` existed is recomputed
from ``results.jsonl`` by the same ``report.summarise`` (so there is still one place that computes statistics).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROW_FIELDS = ("task_id", "level", "score", "steps")


class RunDirError(ValueError):
    """A run directory that cannot be reported on; the message is one line naming the path and the reason."""


class NotRegular(OSError):
    """A path in a run folder that is a link, or lies under one, or is not a regular file: never read."""


def read_inside(folder: Path, *parts: str) -> bytes:
    """The bytes of the regular file ``folder/part/...``, reached without following any link below ``folder``.

    Why: the run viewer serves what a run folder holds, and whoever can write a run folder could plant a link to a
    file the server can read and they cannot (a red team's symlinked figure served a 0600 file). Each component is
    opened relative to the one before with ``O_NOFOLLOW`` (no window between a check and the open), a FIFO does not
    block the open (``O_NONBLOCK``), and the file must be regular. ``NotRegular`` otherwise."""
    if not parts or any(not part or part in (".", "..") or "/" in part or os.sep in part for part in parts):
        raise NotRegular(f"{folder}: {'/'.join(parts)!r} is not a name inside the run folder")
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    if not nofollow or os.open not in os.supports_dir_fd:  # no openat: check each component's own type, then read
        path = folder
        for part in parts:
            path = path / part
            if path.is_symlink():
                raise NotRegular(f"{path}: a link (never followed in a run folder)")
        if not path.is_file():
            raise NotRegular(f"{path}: not a regular file")
        return path.read_bytes()
    directory = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow, dir_fd=directory)
            os.close(directory)
            directory = inner
        fd = os.open(parts[-1], os.O_RDONLY | nofollow | getattr(os, "O_NONBLOCK", 0), dir_fd=directory)
    except OSError as exc:
        raise NotRegular(f"{folder.joinpath(*parts)}: not a regular file inside the run folder "
                         f"({exc.strerror or type(exc).__name__})") from None  # fmt: skip
    finally:
        os.close(directory)
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise NotRegular(f"{folder.joinpath(*parts)}: not a regular file")
        return file.read()


def is_regular_inside(folder: Path, name: str) -> bool:
    """Whether ``folder/name`` is a regular file and not a link (a check for listings; reads use ``read_inside``)."""
    try:
        return stat.S_ISREG((folder / name).lstat().st_mode)
    except OSError:
        return False


def _json(folder: Path, name: str) -> Any:
    path = folder / name
    try:
        return json.loads(read_inside(folder, name))
    except NotRegular as exc:
        raise RunDirError(str(exc)) from None
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
        for file in sorted(folder.glob("*.json")) if folder.is_dir() and not folder.is_symlink() else []:
            try:
                data = json.loads(read_inside(self.path, "trajectories", file.name))
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
    summary = _json(folder, "summary.json")
    if not isinstance(summary, dict) or not isinstance(summary.get("tasks"), dict) or "overall" not in summary:
        raise RunDirError(f"{folder / 'summary.json'}: not an eval summary (no tasks and overall)")
    rows = []
    results = folder / "results.jsonl"
    if not results.is_file():
        raise RunDirError(f"{folder}: no results.jsonl (the run's episodes)")
    try:
        text = read_inside(folder, "results.jsonl").decode(errors="replace")
    except NotRegular as exc:
        raise RunDirError(str(exc)) from None
    except OSError as exc:
        raise RunDirError(f"{results}: unreadable ({exc.__class__.__name__})") from None
    for number, line in enumerate(text.splitlines(), 1):
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
    elif row.get("sealed") is True:  # a sealed counted attempt: its score is the run's published result's
        numeric = score is None
    counted = isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0
    return numeric and counted and isinstance(row["task_id"], str) and isinstance(row["level"], str)


def run_folders(roots: tuple[str, ...] | list[str]) -> dict[str, Path]:
    """The run directories under the operator's roots (each a run, or a folder of runs one level down), by a unique
    name: the folder's name, then ``name-2``... Only these names are ever served: a request never names a path. A
    root is the operator's to name; below it, links are never followed (a linked run folder is not listed)."""
    found: dict[str, Path] = {}
    for root in roots:
        base = Path(root)
        listed = sorted(p for p in base.glob("*") if p.is_dir() and not p.is_symlink())
        candidates = [base] if (base / "summary.json").is_file() else listed
        for folder in candidates:
            if not is_regular_inside(folder, "summary.json"):
                continue
            name, k = folder.name, 2
            while name in found:
                name, k = f"{folder.name}-{k}", k + 1
            found[name] = folder
    return found
