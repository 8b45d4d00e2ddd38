"""The ``mechsandbox`` command: ``serve``, ``tasks [--json|--markdown]``, ``gen-art [--check]``,
``settings [--markdown]``, ``eval``, ``leaderboard`` and ``mcp`` (the episode tools over stdio)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _tasks(args: argparse.Namespace) -> int:
    from .tasks import families

    cards = [f.card() for f in families()]
    if args.json:
        print(json.dumps(cards, indent=1))
        return 0
    if args.markdown:
        print(tasks_markdown(cards))
        return 0
    print(f"{'id':24} {'alias':6} {'difficulty':10} {'version':7} max_steps (easy/medium/hard)")
    for c in cards:
        print(f"{c['id']:24} {c['aliases'][0]:6} {c['difficulty']:10} {c['family_version']:7} {_steps(c)}")
    return 0


def _steps(card: dict) -> str:
    """A family's step budgets, easy/medium/hard."""
    return "/".join(str(card["max_steps"][lvl]) for lvl in card["levels"])


def tasks_markdown(cards: list[dict]) -> str:
    """The README's family table (between ``<!-- tasks:start -->`` and ``<!-- tasks:end -->``), from the cards."""
    lines = ["| id (alias) | difficulty | what the agent must find | answer | max steps (e/m/h) | version |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for c in cards:
        lines.append(f"| `{c['id']}` (`{c['aliases'][0]}`) | {c['difficulty']} | {c['description']} | "
                     f"{c['answer_format']} | {_steps(c)} | {c['family_version']} |")  # fmt: skip
    return "\n".join(lines)


def _gen_art(args: argparse.Namespace) -> int:
    from . import export

    out = Path(args.out) if args.out else export.DEFAULT_DIR
    if args.check:
        notes: list[str] = []
        problems = export.check(out, progress=not args.quiet, notes=notes)
        if problems:
            print(f"gen-art --check FAILED: {len(problems)} mismatch(es) in {out}", file=sys.stderr)
            for line in problems:
                print(f"  {line}", file=sys.stderr)
            return 1
        print(f"gen-art --check OK: {export.n_canonical()} instances match {out / 'manifest.json'}")
        for line in notes:  # allowed, but said: a reviewer on another CPU sees why the bytes differ
            print(f"  within rounding: {line}")
        return 0
    man = export.write(out, progress=not args.quiet)
    print(f"wrote {len(man['files'])} files and manifest.json to {out}")
    return 0


def _settings(args: argparse.Namespace) -> int:
    from . import settings

    print(settings.markdown_table() if args.markdown else settings.text_table(), end="")
    return 0


def _serve(args: argparse.Namespace) -> int:
    if args.dev:  # a development server: its fixed salt, if any, is declared public (its runs are unranked)
        os.environ["MECHSANDBOX_PUBLIC_SALT"] = "true"
    from .server.app import main as serve

    serve(host=args.host, port=args.port)
    return 0


def _lb_config(args: argparse.Namespace) -> int:
    from .loadbalancer import Replica, haproxy_config

    try:
        replicas = [Replica.parse(text) for text in args.replica]
        print(haproxy_config(replicas, bind=args.bind, check_s=args.check_s), end="")
    except ValueError as exc:
        print(f"mechsandbox lb-config: {exc}", file=sys.stderr)
        return 2
    return 0


def _eval(args: argparse.Namespace) -> int:
    from .evaluation.cli import run_eval

    return run_eval(args)


def _report(args: argparse.Namespace) -> int:
    from .evaluation.report_cli import run_report

    return run_report(args)


def _leaderboard(args: argparse.Namespace) -> int:
    """The leaderboard of a running server (``--url``) or of a results database read directly (``--db``)."""
    from .results.leaderboard import table

    try:
        if args.db:
            board = _board_from_database(args.db)
        else:
            import urllib.request

            from .submission import http_base

            with urllib.request.urlopen(f"{http_base(args.url)}/leaderboard", timeout=60) as response:
                board = json.load(response)
    except Exception as exc:  # one line, whatever failed: a URL, a database, a schema
        print(f"mechsandbox leaderboard: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
        return 2
    print(json.dumps(board, indent=1) if args.json else table(board), end="\n" if args.json else "")
    return 0


def _mcp(args: argparse.Namespace) -> int:
    """The episode tools over stdio, relayed to a server's /mcp (integrations/mcp_stdio.py); imports no torch."""
    from .integrations.mcp_stdio import main as relay

    return relay(args.url, args.token)


def _board_from_database(url: str) -> dict:
    from . import BENCHMARK_VERSION
    from .results import ResultStore, leaderboard
    from .tasks import LEVELS, families

    store = ResultStore(url).open(migrate=False)  # reading never changes the schema
    try:
        current = {f.id: f.family_version for f in families()}
        return leaderboard(store.runs(), store.attempts(), current, LEVELS, "", BENCHMARK_VERSION)
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mechsandbox", description="MechSandbox benchmark tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tasks", help="list the task families")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per family")
    p.add_argument("--markdown", action="store_true", help="print the README's table")
    p.set_defaults(fn=_tasks)
    p = sub.add_parser("gen-art", help="write (or --check) the canonical artifacts")
    p.add_argument("--check", action="store_true", help="regenerate in memory and compare with the manifest")
    p.add_argument("--out", help="artifacts directory (default: the package's artifacts/)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=_gen_art)
    p = sub.add_parser("settings", help="list every MECHSANDBOX_* setting: default, values, meaning")
    p.add_argument("--markdown", action="store_true", help="print the README's table")
    p.set_defaults(fn=_settings)
    p = sub.add_parser("serve", help="run the OpenEnv server (settings: MECHSANDBOX_* environment variables)")
    p.add_argument("--host", help="bind address (default MECHSANDBOX_HOST or 0.0.0.0)")
    p.add_argument("--port", type=int, help="port (default MECHSANDBOX_PORT, PORT or 8000)")
    p.add_argument("--dev", action="store_true", help="a development server: a short fixed MECHSANDBOX_TEST_SALT is "
                   "allowed, declared public (MECHSANDBOX_PUBLIC_SALT=true), and its runs are unranked")  # fmt: skip
    p.set_defaults(fn=_serve)
    p = sub.add_parser("lb-config", help="print the HAProxy configuration for replicas behind one address "
                       "(docs/DEPLOY.md)")  # fmt: skip
    p.add_argument("--replica", action="append", required=True, metavar="NAME=HOST:PORT",
                   help="a replica (repeat): NAME is its MECHSANDBOX_REPLICA_ID")  # fmt: skip
    p.add_argument("--bind", default=":8080", help="the balancer's address (default %(default)s)")
    p.add_argument("--check-s", type=float, default=2.0, help="seconds between health checks (default %(default)s)")
    p.set_defaults(fn=_lb_config)
    p = sub.add_parser("eval", help="run an agent over many episodes and write a report")
    p.add_argument("--agent", choices=["scripted", "random", "llm"], required=True)
    p.add_argument("--tasks", default="all", help="all, or comma-separated task ids / aliases")
    p.add_argument("--level", default="all", help="easy, medium, hard, a comma list, or all (default)")
    p.add_argument("--split", choices=["train", "test"], default="test")
    p.add_argument("--seeds", help="train only: a seed range A-B")
    p.add_argument("--episodes", type=int, default=20, help="episodes per task and level (default 20)")
    p.add_argument("--url", nargs="+", help="a running server, a load balancer, or several servers (episodes are "
                   "spread over them in turn; default: start a local one)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--retries", type=int, default=2, help="plays again an episode the infrastructure lost, where safe "
                   "(train always; test only before its first observation)")  # fmt: skip
    p.add_argument("--compare", nargs="*", default=[], help="other runs' output dirs, drawn as baselines "
                   "(refused unless they played the same instances)")
    p.add_argument("--force-compare", action="store_true", help="draw --compare runs even when their instances "
                   "differ (the differences are printed)")
    p.add_argument("--run", help="the run's name on a fixed-salt server (default: the agent's name)")
    p.add_argument("--out", required=True, help="output directory")
    p.set_defaults(fn=_eval)
    p = sub.add_parser("report", help="an eval run's table, figures and (--html) page with every episode")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a folder `mechsandbox eval --out` wrote")
    p.add_argument("--compare", nargs="*", default=[], help="other runs' folders, drawn as baselines (refused "
                   "unless they played the same instances)")  # fmt: skip
    p.add_argument("--force-compare", action="store_true", help="draw --compare runs even when their instances differ")
    p.add_argument("--html", metavar="OUT.html", help="write a self-contained page: table, figures, trajectories")
    p.add_argument("--figures", metavar="DIR", help="where the figures go (default: RUN_DIR)")
    p.set_defaults(fn=_report)
    p = sub.add_parser("leaderboard", help="the runs of a server or results database, ranked, with 95%% intervals")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", default="http://localhost:8000", help="a running server (default %(default)s)")
    where.add_argument("--db", help="a results database URL instead (sqlite:///path or postgresql://...)")
    p.add_argument("--json", action="store_true", help="print the JSON of GET /leaderboard")
    p.set_defaults(fn=_leaderboard)
    p = sub.add_parser("mcp", help="serve the episode tools over stdio (MCP) for desktop and IDE clients, relayed to "
                       "a server's /mcp")  # fmt: skip
    p.add_argument("--url", default=os.environ.get("MECHSANDBOX_URL"), required="MECHSANDBOX_URL" not in os.environ,
                   help="the server, e.g. http://localhost:8000 (default $MECHSANDBOX_URL)")  # fmt: skip
    p.add_argument("--token", default=os.environ.get("MECHSANDBOX_API_TOKEN"),
                   help="its bearer token, where it requires one (default $MECHSANDBOX_API_TOKEN)")  # fmt: skip
    p.set_defaults(fn=_mcp)
    args, _ = parser.parse_known_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
