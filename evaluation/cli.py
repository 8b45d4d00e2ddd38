"""``mechsandbox eval``: argument handling around the harness and the report.

Exit status: 0 when every episode was graded, 1 when some remain lost to the infrastructure after the retries (the
run's means are then over fewer episodes than planned: the final line and ``summary.json`` say how many), 2 for
a run that could not start (bad arguments, servers that disagree, a run that could not be registered).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from ..agents import LLMAgent, RandomAgent, ScriptedAgent
from ..agents.llm import client_from_env
from ..submission import register_run, server_scoring
from .compare import compare_refusal, instance_keys
from .harness import RETRIES, Plan, parse_levels, parse_seeds, parse_tasks, run_info, run_plan
from .local_server import LocalServer
from .report import infrastructure_line, interval_text, write_all


def run_eval(args: argparse.Namespace) -> int:
    try:
        plan = Plan(parse_tasks(args.tasks), parse_levels(args.level), args.split, args.episodes,
                    parse_seeds(args.seeds))  # fmt: skip
    except (KeyError, ValueError) as exc:
        print(f"mechsandbox eval: {exc}", file=sys.stderr)
        return 2
    if args.seeds and args.split != "train":
        print("mechsandbox eval: --seeds is for --split train", file=sys.stderr)
        return 2
    if args.agent == "scripted":
        make = lambda i: ScriptedAgent()  # noqa: E731
    elif args.agent == "random":
        make = lambda i: RandomAgent()  # noqa: E731 (seeded per episode by the instance)
    else:
        client, model, error = client_from_env()
        if error:
            print(f"mechsandbox eval: {error}", file=sys.stderr)
        make = lambda i: LLMAgent(client, model)  # noqa: E731
    out = Path(args.out)
    baselines = {}
    for other in args.compare:
        summary = Path(other) / "summary.json"
        if not summary.exists():
            print(f"mechsandbox eval: --compare {other}: no summary.json there", file=sys.stderr)
            return 2
        data = json.loads(summary.read_text())
        baselines[str(other)] = data
    info = run_info(make(0), args.split)
    with contextlib.ExitStack() as stack:
        urls = list(args.url or [])
        if not urls:
            out.mkdir(parents=True, exist_ok=True)
            env = {} if "MECHSANDBOX_DATA_DIR" in os.environ else {"MECHSANDBOX_DATA_DIR": str(out / "server-data")}
            urls = [stack.enter_context(LocalServer(env=env, log_path=out / "server.log")).url]
        url = urls[0]
        scoring, error = agreed_scoring(urls, args.split)
        if error:
            print(f"mechsandbox eval: {error}", file=sys.stderr)
            return 2
        versions = {t: v for t, v in scoring["family_versions"].items() if t in plan.tasks}
        info.update(salt=scoring["test_salt"], salt_fingerprint=scoring["salt_fingerprint"], family_versions=versions,
                    benchmark_version=scoring["benchmark_version"] or info["benchmark_version"],
                    instances=instance_keys(plan.resets))  # fmt: skip
        if args.split == "test" and scoring["test_salt"] != "fixed":
            where = "a server it started itself" if not args.url else url
            print(f"mechsandbox eval: warning: {where} has a random test salt, so these test instances exist only "
                  "while it runs: the scores are comparable with no other run (set MECHSANDBOX_TEST_SALT)",
                  file=sys.stderr)  # fmt: skip
        refusal = compare_refusal(baselines, info, args.force_compare)
        if refusal:
            print(refusal, file=sys.stderr)
            return 2
        if args.split == "test" and scoring["test_salt"] == "fixed":
            error = join_run(url, args.run or info["agent"], plan, info)
            if error:
                print(f"mechsandbox eval: could not register a run: {error}", file=sys.stderr)
                return 2
        retries = getattr(args, "retries", RETRIES)
        if retries < 0:
            print("mechsandbox eval: --retries must be 0 or more", file=sys.stderr)
            return 2
        records = run_plan(plan, urls, make, concurrency=args.concurrency, retries=retries)
        if info.get("run_id"):
            finish_run(url, plan, info)
    info["instance_ids"] = sorted(r.instance_id for r in records if r.instance_id)
    summary = write_all(out, records, info, {data["run"].get("agent", k): data for k, data in baselines.items()})
    o, lost = summary["overall"], summary["infrastructure_errors"]
    mean = f"mean score {interval_text(o)} (95% interval)" if o["episodes"] else "no mean (none was graded)"
    print(f"{o['episodes']} episodes, {mean}; {lost} infrastructure error{'s' if lost != 1 else ''}; "
          f"report in {out}")  # fmt: skip
    if lost:
        print(f"mechsandbox eval: {infrastructure_line(summary)} (after {retries} retries where safe)", file=sys.stderr)
        return 1
    return 0


def agreed_scoring(urls: list[str], split: str) -> tuple[dict, str | None]:
    """The scoring facts of the first server, and an error unless every server states the same ones.

    Why: episodes spread over several servers are one run only if those servers play the same instances (for the
    test split, one salt) with the same family versions; a run registered on the first is found by the others only
    if they share its results database (docs/DEPLOY.md), which an episode on a server that does not would report."""
    facts = []
    for url in urls:
        try:
            facts.append(server_scoring(url))
        except (OSError, RuntimeError, ValueError) as exc:
            return {}, f"cannot read {url}/tasks: {exc}"
    keys = ("family_versions", "benchmark_version") + (("test_salt", "salt_fingerprint") if split == "test" else ())
    for url, other in zip(urls[1:], facts[1:], strict=True):
        differ = [k for k in keys if other.get(k) != facts[0].get(k)]
        if differ:
            return {}, f"{url} and {urls[0]} differ in {', '.join(differ)}: they cannot share one run"
    return facts[0], None


def finish_run(url: str, plan: Plan, info: dict) -> None:
    """Finish the counted run (``POST /runs/{id}/finish``): its scores were sealed while it played, and finishing
    publishes its aggregates, which go into ``summary.json`` (``run.published``). A failure is one line; the run can
    be finished later with its token (never written to disk)."""
    from ..submission import _request, http_base

    token = next((r.get("run_token") for r in plan.resets if r.get("run_token")), None)
    try:
        entry = _request(f"{http_base(url)}/runs/{info['run_id']}/finish", {"run_token": token})
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"mechsandbox eval: could not finish {info['run_id']}: {exc}", file=sys.stderr)
        return
    info["published"] = {k: entry.get(k) for k in ("status", "overall", "ci95", "episodes", "families", "levels",
                                                    "precision", "complete")}  # fmt: skip
    print(f"mechsandbox eval: {info['run_id']} finished: published overall {entry.get('overall')} "
          f"{entry.get('ci95')} (precision {entry.get('precision')})", file=sys.stderr)  # fmt: skip


def join_run(url: str, name: str, plan: Plan, info: dict) -> str | None:
    """Register a run on a fixed-salt server and put its token into every planned reset; the error, if any."""
    notes = f"mechsandbox eval --agent {info['agent']}; commit {info['git_commit'][:10]}"
    try:
        run = register_run(url, name, info.get("model") or "", notes)
    except (OSError, RuntimeError, ValueError) as exc:
        return str(exc)
    info["run_id"] = run["run_id"]
    print(f"mechsandbox eval: playing as {run['run_id']} (salt fingerprint {run['salt_fingerprint']})", file=sys.stderr)
    for reset in plan.resets:
        reset["run_token"] = run["run_token"]
    return None
