"""``mechsandbox eval``: argument handling around the harness and the report."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from ..agents import LLMAgent, RandomAgent, ScriptedAgent
from ..agents.llm import client_from_env
from .harness import Plan, parse_levels, parse_seeds, parse_tasks, run_info, run_plan
from .local_server import LocalServer
from .report import write_all


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
        make = lambda i: RandomAgent(seed=i)  # noqa: E731
    else:
        client, model, error = client_from_env()
        if error:
            print(f"mechsandbox eval: {error}", file=sys.stderr)
        make = lambda i: LLMAgent(client, model)  # noqa: E731
    out = Path(args.out)
    baselines = {}
    for other in args.compare:
        summary = Path(other) / "summary.json"
        if summary.exists():
            data = json.loads(summary.read_text())
            baselines[data["run"].get("agent", other)] = data
    with contextlib.ExitStack() as stack:
        url = args.url
        if not url:
            out.mkdir(parents=True, exist_ok=True)
            url = stack.enter_context(LocalServer(log_path=out / "server.log")).url
        records = run_plan(plan, url, make, concurrency=args.concurrency)
    summary = write_all(out, records, run_info(make(0), args.split), baselines)
    o = summary["overall"]
    print(f"{o['episodes']} episodes, mean score {o['mean_score']:.3f} ± {o['ci95']:.3f}; report in {out}")
    return 0
