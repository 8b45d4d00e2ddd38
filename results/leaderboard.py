"""The leaderboard, computed from the raw rows (``RunInfo`` and ``Attempt``) by one pure function.

Rules, each for a reason:
- a run's score on a family is the mean of its counted attempts; an attempt still open (reset, never finished)
  counts at the floor, as an abandoned one does, so leaving an episode unfinished never helps;
- the 95% interval is Wilson's score interval for a proportion, applied to the mean score with n = episodes. Scores
  lie in [0, 1], so their variance is at most mean·(1 - mean), which makes the interval conservative; unlike the
  normal approximation it stays inside [0, 1], is not zero-width when every score is 0.99, and is wide at n = 1;
- runs are compared only within one *group*: the same salt fingerprint, benchmark version, family versions
  (a family a run has not played counts as the current version) and standard-set size. A run on another
  version of a family is listed in its own group, never averaged or ranked with these;
- inside a group, complete runs (every instance of the standard set attempted and finished: ``standard_set``
  indices of every family and level) rank first, by overall mean; partial runs follow, whatever their mean;
- only the standard set counts (the server refuses a run's reset outside it): a run cannot pad its mean with
  extra instances of the families it does best on, and every complete run's mean is over the same instances;
- a run's scores are sealed until it is finished (issue 55): an unfinished run shows its coverage only, never a
  score or anything computed from one; a finished run shows only what ``publish`` computed when it finished (stored
  on the run, never recomputed), so no route ever reads a per-instance score back.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from .store import Attempt, RunInfo

FLOOR = 0.01  # the protocol's floor (mechsandbox.protocol.FLOOR; kept literal so this package imports nothing else)
Z95 = 1.959963984540054
# The published precision of a finished run's aggregates (docs/CONTRACT.md, "Runs and what counts"): each mean is
# rounded to a multiple of its quantum after a secret per-run, per-cell dither, so one answer's change moves a cell by
# at most 0.98 / n, and shows with probability at most (0.98 / n) / quantum. Family-by-level cells (n = 20) are
# not published: one answer moves them by up to 0.049, an oracle at any useful precision.
QUANTA = {"overall": 0.01, "family": 0.1, "level": 0.05}
SPREAD = 4  # a cell's quantum is at least SPREAD times one answer's largest move (0.98 / n): for small standard sets
Dither = Callable[[str], float]  # a cell's name -> a secret number in [0, 1), fixed per run and cell


def wilson_interval(mean: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's 95% score interval around ``mean`` (a proportion, or a mean of scores in [0, 1]) of ``n`` samples."""
    if n <= 0:
        return (0.0, 1.0)
    p = min(1.0, max(0.0, mean))
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4))


def counted_score(attempt: Attempt) -> float:
    """What an attempt counts for: its score once graded, the floor while open, truncated, abandoned or lost."""
    return attempt.score if attempt.status == "graded" and attempt.score is not None else FLOOR


def summary(scores: Sequence[float]) -> dict[str, Any]:
    mean = statistics.fmean(scores) if scores else 0.0
    return {"mean": round(mean, 4), "ci95": list(wilson_interval(mean, len(scores))), "episodes": len(scores)}


def dither_for(secret: bytes, run_id: str) -> Dither:
    """The run's dither: HMAC(secret, run and cell) as a number in [0, 1). Secret (the test salt), so nobody can
    predict where a cell's rounding boundary lies; per run, so runs' roundings are independent draws."""
    def draw(cell: str) -> float:
        digest = hmac.new(secret, f"publish/{run_id}/{cell}".encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big") / 2**64
    return draw


def dithered(mean: float, quantum: float, u: float) -> float:
    """``mean`` rounded to a multiple of ``quantum`` by a dither ``u`` in [0, 1): up with probability equal to how far
    ``mean`` lies past the multiple below it, so the published value is unbiased over runs and within one quantum."""
    steps = math.floor(mean / quantum + u)
    return round(min(1.0, max(0.0, steps * quantum)), 4)


def publish(run: RunInfo, attempts: list[Attempt], standard: Mapping[str, str], levels: Sequence[str],
            dither: Dither) -> dict[str, Any]:  # fmt: skip
    """What a run publishes when it is finished: dithered means over its whole standard set, per family, per level
    and overall (an instance it never finished counts at the floor, so every cell's n is fixed by the set's size and
    says nothing either). Computed once and stored on the run."""
    played = {(a.task_id, a.level, a.instance_index): a for a in attempts
              if 0 <= a.instance_index < run.standard_set and a.status != "voided"}  # fmt: skip
    score_of: dict[tuple[str, str, int], float] = {}
    for task_id in standard:
        for level in levels:
            for index in range(run.standard_set):
                attempt = played.get((task_id, level, index))
                score_of[(task_id, level, index)] = counted_score(attempt) if attempt is not None else FLOOR

    precision: dict[str, float] = {}

    def cell(name: str, kind: str, keys: list[tuple[str, str, int]]) -> dict[str, Any]:
        mean = statistics.fmean(score_of[k] for k in keys) if keys else 0.0
        quantum = precision.setdefault(kind, quantum_for(kind, len(keys)))
        shown = dithered(mean, quantum, dither(name))
        return {"mean": shown, "ci95": list(wilson_interval(shown, len(keys))), "episodes": len(keys)}

    versions: dict[str, set[str]] = defaultdict(set)
    for attempt in played.values():
        versions[attempt.task_id].add(attempt.family_version)
    families = {}
    for task_id in sorted(standard):
        families[task_id] = cell(f"family/{task_id}", "family", [k for k in score_of if k[0] == task_id])
        families[task_id]["family_version"] = ",".join(sorted(versions.get(task_id) or {standard[task_id]}))
    return {
        "overall": cell("overall", "overall", list(score_of)),
        "families": families,
        "levels": {level: cell(f"level/{level}", "level", [k for k in score_of if k[1] == level]) for level in levels},
        "precision": precision,
    }


def quantum_for(kind: str, n: int) -> float:
    """The published precision of a cell of ``n`` instances: ``QUANTA[kind]``, coarser where one answer (0.98 / n)
    would move the mean by more than a quarter of it, so a run tells two answers apart with chance below 1/4 a cell."""
    least = SPREAD * (1 - 2 * FLOOR) / max(n, 1)
    return QUANTA[kind] if QUANTA[kind] >= least else min(1.0, round(math.ceil(least * 100) / 100, 2))


def group_key(salt_fingerprint: str, benchmark_version: str, versions: Mapping[str, str], standard_set: int) -> str:
    """Which runs are comparable: same test set (salt), benchmark and family versions, and standard-set size."""
    text = f"{salt_fingerprint}|{benchmark_version}|{standard_set}|"
    text += ",".join(f"{k}={v}" for k, v in sorted(versions.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def run_entry(run: RunInfo, attempts: list[Attempt], standard: Mapping[str, str], levels: Sequence[str]) -> dict:
    """One run's row: per-family and overall means with intervals, coverage, versions, completeness."""
    attempts = [a for a in attempts if 0 <= a.instance_index < run.standard_set]  # a run plays only the set
    voids = sum(a.voids for a in attempts) + sum(1 for a in attempts if a.status == "voided")
    lost = sum(1 for a in attempts if a.status == "lost")
    attempts = [a for a in attempts if a.status != "voided"]  # not played yet: the server voided it before any step
    by_family: dict[tuple[str, str], list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        by_family[(attempt.task_id, attempt.family_version)].append(attempt)
    versions_of: dict[str, set[str]] = defaultdict(set)
    for task_id, version in by_family:
        versions_of[task_id].add(version)
    published = run.published if run.finished_at is not None and isinstance(run.published, dict) else None
    finished = {(a.task_id, a.family_version, a.level, a.instance_index) for a in attempts if a.status != "open"}
    attempted = {(a.task_id, a.family_version, a.level, a.instance_index) for a in attempts}
    # The set a run must finish, at the versions it played (a family it has not played: the current version), so
    # a run stays complete after a later upgrade; a family played at two versions cannot be completed.
    own = {**standard, **{t: next(iter(vs)) for t, vs in versions_of.items() if len(vs) == 1}}
    mixed = {t for t, vs in versions_of.items() if len(vs) > 1}
    wanted = [(t, v, lv, k) for t, v in own.items() for lv in levels for k in range(run.standard_set)]
    covered = sum(1 for key in wanted if key in attempted)
    missing: dict[str, int] = {}
    for t, v, lv, k in wanted:
        if (t, v, lv, k) not in finished:
            missing[f"{t}/{lv}"] = missing.get(f"{t}/{lv}", 0) + 1
    versions = {t: ",".join(sorted(vs)) for t, vs in sorted(versions_of.items())}
    overall = published["overall"] if published else {"mean": None, "ci95": None, "episodes": None}
    return {
        "run_id": run.run_id,
        "agent": run.agent,
        "model": run.model,
        "submitter": run.submitter,
        "status": "withdrawn" if run.withdrawn_at is not None else "finished" if published else "sealed",
        "finished_at": run.finished_at,
        "withdrawn_at": run.withdrawn_at,
        "overall": overall["mean"],  # None while sealed: nothing computed from a score shows before the run finishes
        "ci95": overall["ci95"],
        "episodes": overall["episodes"],
        "complete": bool(wanted) and not missing and not mixed,
        "families": published["families"] if published else {},
        "levels": published["levels"] if published else {},
        "precision": published.get("precision") if published else None,
        "coverage": {
            "standard_set": len(wanted),
            "attempted": covered,
            "open": sum(1 for a in attempts if a.status == "open"),
            "voided": voids,  # attempts the server lost before the agent's first step (each may be played again)
            "lost": lost,  # attempts the server lost after it (each counts at the floor)
            "unfinished_by_task_level": missing,
        },
        "salt_fingerprint": run.salt_fingerprint,
        "benchmark_version": run.benchmark_version,
        "family_versions": versions,
        "group": group_key(run.salt_fingerprint, run.benchmark_version, {**standard, **versions}, run.standard_set),
        "created_at": run.created_at,
    }


def leaderboard(
    runs: Iterable[RunInfo],
    attempts: Iterable[Attempt],
    standard: Mapping[str, str],
    levels: Sequence[str],
    salt_fingerprint: str = "",
    benchmark_version: str = "",
    standard_set: int = 20,
    public_fingerprints: Collection[str] = (),
) -> dict[str, Any]:
    """``{"runs": [...], "groups": [...], ...}``: ranked runs (see the module doc), current group first.

    ``standard`` maps each family of the benchmark to its current version (the standard set's families).
    ``public_fingerprints``: the salts whose test set anyone may know (a published calibration salt, a server's
    declared ``MECHSANDBOX_PUBLIC_SALT``): their runs are listed with ``public_salt: true`` and no rank.
    """
    by_run: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        by_run[attempt.run_id].append(attempt)
    entries = [run_entry(run, by_run.get(run.run_id, []), standard, levels) for run in runs]
    current = group_key(salt_fingerprint, benchmark_version, standard, standard_set)
    groups: dict[str, list[dict]] = defaultdict(list)
    for entry in entries:
        groups[entry["group"]].append(entry)
    ordered: list[dict] = []
    group_list = []
    finished_runs: dict[str, int] = defaultdict(int)
    for entry in entries:
        finished_runs[entry["submitter"]] += entry["finished_at"] is not None
    for entry in entries:
        entry["submitter_finished_runs"] = finished_runs[entry["submitter"]]
    for key in sorted(groups, key=lambda g: (g != current, g)):
        # Ranked: finished runs, complete ones first; sealed and withdrawn runs are listed after them, unranked.
        members = sorted(groups[key], key=lambda e: (e["status"] != "finished", not e["complete"],
                                                     -(e["overall"] or 0.0), e["created_at"]))  # fmt: skip
        for rank, entry in enumerate(members, 1):
            entry["rank"] = rank if entry["status"] == "finished" else None
        ordered.extend(members)
        group_list.append({"group": key, "current": key == current, "runs": len(members)})
    public = set(public_fingerprints)
    for entry in ordered:  # a group is one salt: a public one's whole group is unranked
        entry["public_salt"] = entry["salt_fingerprint"] in public
        if entry["public_salt"]:
            entry["rank"] = None
    for group in group_list:
        group["public_salt"] = any(e["public_salt"] for e in ordered if e["group"] == group["group"])
    return {
        "runs": ordered,
        "groups": group_list,
        "current_group": current,
        "interval": "Wilson 95% score interval on the published (dithered, rounded) mean (n = episodes)",
        "precision": dict(QUANTA),
        "open_attempts_count_as": FLOOR,
    }


def table(board: Mapping[str, Any]) -> str:
    """The leaderboard as a plain-text table, one block per group of comparable runs (current group first)."""
    lines: list[str] = []
    families = sorted({key for run in board["runs"] for key in run["families"]})
    for group in board["groups"]:
        members = [run for run in board["runs"] if run["group"] == group["group"]]
        first = members[0]
        title = "current test set and versions" if group["current"] else "another test set or family versions"
        lines.append(f"group {group['group']} ({title}): salt {first['salt_fingerprint']}, "
                     f"benchmark {first['benchmark_version']}")  # fmt: skip
        lines.append(f"{'rank':>4}  {'run':20}  {'submitter (runs)':20}  {'agent':20}  {'model':24}  {'overall':>7}  "
                     f"{'95% CI':13}  {'status':9}  coverage")  # fmt: skip
        for run in members:
            if run["overall"] is None:
                overall, interval = f"{'sealed':>7}", " " * 13
            else:
                low, high = run["ci95"]
                overall, interval = f"{run['overall']:7.2f}", f"[{low:.3f},{high:.3f}]"
            status = run["status"] if run["status"] != "finished" else "complete" if run["complete"] else "partial"
            coverage = f"{run['coverage']['attempted']}/{run['coverage']['standard_set']}"
            who = f"{run['submitter'][:15]} ({run['submitter_finished_runs']})"
            rank = run["rank"] if run["rank"] is not None else "-"
            lines.append(f"{rank:>4}  {run['run_id']:20}  {who[:20]:20}  {run['agent'][:20]:20}  "
                         f"{run['model'][:24]:24}  {overall}  {interval}  {status:9}  {coverage}")  # fmt: skip
            cells = [f"{key} {run['families'][key]['mean']:.2f} (n={run['families'][key]['episodes']})"
                     for key in families if key in run["families"]]  # fmt: skip
            if cells:
                lines.append("      " + "; ".join(cells))
        lines.append("")
    if not board["runs"]:
        lines.append("no runs yet")
    lines.append(f"intervals: {board['interval']}; open attempts count as {board['open_attempts_count_as']}")
    return "\n".join(lines) + "\n"
