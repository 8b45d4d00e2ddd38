"""The ``mechsandbox`` command: ``serve``, ``tasks [--json]``, ``gen-art [--check]`` (``eval`` later)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _tasks(args: argparse.Namespace) -> int:
    from .tasks import families

    cards = [f.card() for f in families()]
    if args.json:
        print(json.dumps(cards, indent=1))
        return 0
    print(f"{'id':24} {'alias':6} {'difficulty':10} {'version':7} max_steps (easy/medium/hard)")
    for c in cards:
        steps = "/".join(str(c["max_steps"][lvl]) for lvl in c["levels"])
        print(f"{c['id']:24} {c['aliases'][0]:6} {c['difficulty']:10} {c['family_version']:7} {steps}")
    return 0


def _gen_art(args: argparse.Namespace) -> int:
    from . import export

    out = Path(args.out) if args.out else export.DEFAULT_DIR
    if args.check:
        problems = export.check(out, progress=not args.quiet)
        if problems:
            print(f"gen-art --check FAILED: {len(problems)} mismatch(es) in {out}", file=sys.stderr)
            for line in problems:
                print(f"  {line}", file=sys.stderr)
            return 1
        print(f"gen-art --check OK: {export.n_canonical()} instances match {out / 'manifest.json'}")
        return 0
    man = export.write(out, progress=not args.quiet)
    print(f"wrote {len(man['files'])} files and manifest.json to {out}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .server.app import main as serve

    serve(host=args.host, port=args.port)
    return 0


def _not_yet(args: argparse.Namespace) -> int:
    print(
        f"mechsandbox {args.command}: not available in this version yet (the server and the eval "
        "harness come with later issues); `mechsandbox tasks` and `mechsandbox gen-art` work now",
        file=sys.stderr,
    )
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mechsandbox", description="MechSandbox benchmark tools")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tasks", help="list the task families")
    p.add_argument("--json", action="store_true", help="print a JSON list, one object per family")
    p.set_defaults(fn=_tasks)
    p = sub.add_parser("gen-art", help="write (or --check) the canonical artifacts")
    p.add_argument("--check", action="store_true", help="regenerate in memory and compare with the manifest")
    p.add_argument("--out", help="artifacts directory (default: the package's artifacts/)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=_gen_art)
    p = sub.add_parser("serve", help="run the OpenEnv server (settings: MECHSANDBOX_* environment variables)")
    p.add_argument("--host", help="bind address (default MECHSANDBOX_HOST or 0.0.0.0)")
    p.add_argument("--port", type=int, help="port (default MECHSANDBOX_PORT, PORT or 8000)")
    p.set_defaults(fn=_serve)
    p = sub.add_parser("eval", help="(later issue)")
    p.set_defaults(fn=_not_yet)
    args, _ = parser.parse_known_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
