"""``mechsandbox report``: an eval run folder's table, figures and page, read back without a server (and without
importing the agents or OpenEnv, so it starts quickly)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .compare import compare_refusal
from .report import markdown
from .rundir import RunDirError, load_run


def run_report(args: argparse.Namespace) -> int:
    """``mechsandbox report RUN_DIR [--compare DIR...] [--html OUT]``: the run's table (stdout), its figures redrawn
    (with the baselines), and optionally one self-contained HTML page: the table, the figures and every episode's
    trajectory with filters. Reads only what ``mechsandbox eval`` wrote; computes no statistic of its own."""
    prog = "mechsandbox report"
    try:
        run = load_run(args.run_dir)
        others = [load_run(other) for other in args.compare]
    except RunDirError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    baselines = {f"{o.summary['run'].get('agent', 'run')} ({o.name})": o.summary for o in others}
    refusal = compare_refusal(baselines, run.summary.get("run", {}), args.force_compare, prog)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    print(markdown(run.summary), end="")
    figures = Path(args.figures) if args.figures else run.path
    try:
        from .figures import write_figures

        figures.mkdir(parents=True, exist_ok=True)
        written = write_figures(run.summary, run.rows, figures, baselines)
        if args.html:
            from ..web.pages import run_page

            Path(args.html).write_text(run_page(run, baselines, inline=True, figures=figures))  # the SVGs just drawn
    except OSError as exc:
        print(f"{prog}: cannot write ({exc.strerror or exc}): {exc.filename or ''}", file=sys.stderr)
        return 2
    print(f"{prog}: figures {', '.join(p.name for p in written)} in {figures}"
          + (f"; page {args.html}" if args.html else ""), file=sys.stderr)  # fmt: skip
    return 0
