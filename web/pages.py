"""The page shell and the run viewer's pages, rendered on the server (or by ``mechsandbox report --html``).

A page served by the server links its stylesheet and scripts from ``/web/static/`` (the Content-Security-Policy then
forbids any inline script); a page written to a file inlines them, so it opens anywhere without a server. Every
value from a run folder or the database goes through ``esc``; figures are embedded as ``<img>`` data URIs, so an SVG
could never run a script even if a run's names held one.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..evaluation.figures import NAMES, SOLVED_SCORE, draw, run_levels, svg_text
from ..evaluation.report import infrastructure_line, interval_text
from ..evaluation.rundir import RunDir, read_inside
from ..tasks import LEVELS

STATIC = ("style.css", "runs.js", "playground.js")  # everything /web/static/ serves: a fixed list, never a path
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")  # fmt: skip


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


@cache  # four small files, read once per process instead of once per request
def static_text(name: str) -> str:
    if name not in STATIC:
        raise KeyError(name)
    return resources.files(__package__).joinpath("static", name).read_text()


def shell(title: str, body: str, scripts: Iterable[str] = (), inline: bool = False) -> str:
    """A whole page. ``inline``: the stylesheet and scripts inside it (a file that opens without a server)."""
    if inline:
        head = f"<style>{static_text('style.css')}</style>"
        tail = "".join(f"<script>{static_text(s)}</script>" for s in scripts)
    else:
        head = '<link rel="stylesheet" href="/web/static/style.css">'
        tail = "".join(f'<script src="/web/static/{esc(s)}"></script>' for s in scripts)
    nav = "" if inline else '<a href="/web">playground</a><a href="/web/runs">runs</a><a href="/docs">API</a>'
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{head}</head><body>'
            f"<header><h1>{esc(title)}</h1>{nav}</header><main>{body}</main>{tail}</body></html>")  # fmt: skip


def message_page(title: str, message: str, inline: bool = False) -> str:
    return shell(title, f'<p class="status error" id="message">{esc(message)}</p>', inline=inline)


def _svg_img(svg: str, alt: str) -> str:
    data = base64.b64encode(svg.encode()).decode()
    return f'<img alt="{esc(alt)}" src="data:image/svg+xml;base64,{data}">'


def cell(value: Any, num: bool = False) -> str:
    """A table cell; its text escaped."""
    text = esc(value)
    return f'<td class="num">{text}</td>' if num else f"<td>{text}</td>"


def table(headers: Iterable[str], rows: Iterable[str], table_id: str = "", css: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    attrs = (f' id="{table_id}"' if table_id else "") + (f' class="{css}"' if css else "")
    return f"<table{attrs}><tr>{head}</tr>{''.join(rows)}</table>"


def _mean_cell(entry: Mapping[str, Any]) -> str:
    return cell(f"{interval_text(entry)} (n={entry['episodes']})", num=True)


def _board_cell(mean: Any, interval: list[float] | None) -> str:
    """A leaderboard mean and its Wilson interval, as the database published them; "sealed" for a run not finished."""
    if mean is None or not interval:
        return cell("sealed", num=True)
    return cell(f"{mean} [{interval[0]}, {interval[1]}]", num=True)


def summary_table(summary: Mapping[str, Any]) -> str:
    """Per family: each level run and all together, as mean [95% interval] (n), from summary.json as written."""
    levels = run_levels(summary)
    rows = []
    for family, entry in sorted(summary["tasks"].items()):
        by_level = "".join(_mean_cell(entry["levels"][lv]) if lv in entry["levels"] else cell("-") for lv in levels)
        tail = cell(entry.get("solved", "-"), num=True) + cell(entry["mean_steps"], num=True)
        rows.append(f'<tr data-family="{esc(family)}">{cell(family)}{cell(entry.get("family_version", ""))}'
                    f"{by_level}{_mean_cell(entry)}{tail}</tr>")  # fmt: skip
    o = summary["overall"]
    rows.append(f'<tr id="overall"><th colspan="{2 + len(levels)}">overall</th>{_mean_cell(o)}'
                f'{cell(o.get("solved", "-"), num=True)}<td></td></tr>')  # fmt: skip
    headers = ["family", "version", *levels, "all levels", f"solved (score >= {SOLVED_SCORE})", "mean steps"]
    return table(headers, rows, "summary")


def _run_header(summary: Mapping[str, Any], name: str) -> str:
    run = summary.get("run", {})
    facts = [("run", name), ("agent", run.get("agent")), ("model", run.get("model")), ("split", run.get("split")),
             ("benchmark", run.get("benchmark_version")), ("commit", str(run.get("git_commit") or "")[:10]),
             ("temperature", run.get("temperature")), ("run id", run.get("run_id"))]  # fmt: skip
    shown = " &middot; ".join(f"{k} <b>{esc(v)}</b>" for k, v in facts if v not in (None, ""))
    return f'<p class="muted">{shown}</p>'


def _action_text(action: Any) -> tuple[str, str]:
    if not isinstance(action, Mapping) or not action:
        return "none", _json(action) if action else ""
    for key in ("python_code", "solution_target", "solution_from"):
        if action.get(key) is not None:
            value = action[key]
            return key, value if isinstance(value, str) and key != "solution_target" else _json(value)
    return "action", _json(action)


def _json(value: Any) -> str:
    import json

    return json.dumps(value, indent=1, default=str)


def _outcome(episode: Mapping[str, Any]) -> str:
    if episode.get("infra_error"):  # lost to the infrastructure: no score, in no mean (docs/CONTRACT.md)
        return "infrastructure"
    if episode.get("error"):
        return "error"
    score = episode.get("score")
    return "solved" if isinstance(score, (int, float)) and score >= SOLVED_SCORE else "unsolved"


def trajectories_section(run: RunDir) -> str:
    items, unreadable = [], []
    families, levels = set(), set()
    for number, episode in enumerate(run.trajectories()):
        if "unreadable" in episode:
            unreadable.append(str(episode["unreadable"]))
            continue
        family, level, outcome = str(episode.get("task_id", "?")), str(episode.get("level", "?")), _outcome(episode)
        families.add(family)
        levels.add(level)
        turns = []
        for turn in episode.get("turns") if isinstance(episode.get("turns"), list) else []:
            if not isinstance(turn, Mapping):
                continue
            kind, text = _action_text(turn.get("action"))
            error = f'<p class="error">{esc(turn["error"])}</p>' if turn.get("error") else ""
            turns.append(f'<div class="turn"><span class="muted">step {esc(turn.get("step"))} &middot; {esc(kind)} '
                         f'&middot; reward {esc(turn.get("reward"))}</span><pre>{esc(text)}</pre>'
                         + (f'<pre class="output">{esc(turn.get("output"))}</pre>' if turn.get("output") else "")
                         + f"{error}</div>")  # fmt: skip
        lost = episode.get("infra_error")
        why = (lost.get("message") if isinstance(lost, Mapping) else lost) or episode.get("error")
        failure = f' &middot; <span class="error">{esc(why)}</span>' if why else ""
        items.append(f'<details class="episode" data-family="{esc(family)}" data-level="{esc(level)}" '
                     f'data-outcome="{outcome}"><summary>#{number} {esc(family)} / {esc(level)} &middot; '
                     f'{esc(episode.get("instance_id", ""))} &middot; score <b>{esc(episode.get("score"))}</b> '
                     f'&middot; {esc(episode.get("steps", len(turns)))} steps &middot; {outcome}{failure}</summary>'
                     f'{"".join(turns)}</details>')  # fmt: skip
    outcomes = ["solved", "unsolved", "error", "infrastructure"]
    selects = [_select("family", families), _select("level", levels), _select("outcome", outcomes)]
    filters = f'<div class="row">{"".join(selects)}<span class="muted" id="shown"></span></div>'
    note = f'<p class="muted">unreadable trajectory files: {esc(", ".join(unreadable))}</p>' if unreadable else ""
    if not items:
        return "<h2>Episodes</h2><p class=\"muted\">no trajectory files in this run</p>" + note
    return f'<h2>Episodes</h2>{filters}{note}<div id="episodes">{"".join(items)}</div>'


def _select(name: str, values: Iterable[str]) -> str:
    options = "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in sorted(values))
    return f'<label>{name}<select id="filter-{name}"><option value="">all</option>{options}</select></label>'


ALT = {"scores": "mean score per family with 95% intervals", "levels": "mean score per family and level",
       "steps": "steps to solve"}  # fmt: skip


def _figure_svg(run: RunDir, name: str, folder: Path | None, baselines: Mapping[str, Mapping[str, Any]] | None) -> str:
    """The SVG that ``mechsandbox eval`` or ``report`` already wrote into ``folder`` (drawn from the same summary),
    else drawn now (a run from before the figures, or no folder given): a page view does not redraw what exists."""
    if folder is not None:  # only a regular file in the folder, never through a link (rundir.read_inside)
        try:
            return read_inside(folder, f"{name}.svg").decode()
        except (OSError, UnicodeDecodeError):
            pass
    return svg_text(draw(name, run.summary, run.rows, baselines))


def run_page(run: RunDir, baselines: Mapping[str, Mapping[str, Any]] | None = None, inline: bool = False,
             figures: Path | None = None) -> str:  # fmt: skip
    """The run's page; ``figures``: the folder holding its SVGs (the run folder on the server, the folder ``report``
    just drew into), else they are drawn."""
    summary = run.summary
    images = "".join(_svg_img(_figure_svg(run, name, figures, baselines), ALT[name]) for name in NAMES)
    # A test-split folder never shows its episodes: their instance ids and answers, published, would hand a strong
    # run's answers to everyone who plays the same salt (issue 55).
    episodes = (trajectories_section(run) if summary.get("run", {}).get("split") != "test" else
                '<h2>Episodes</h2><p class="muted">not shown: a test-split run\'s episodes hold test answers</p>')
    lost = infrastructure_line(summary)
    warning = f'<p class="error"><b>{esc(lost)}</b></p>' if lost else ""
    body = (_run_header(summary, run.name) + warning + "<h2>Scores</h2>" + summary_table(summary)
            + f'<h2>Figures</h2><div class="figure">{images}</div>' + episodes)  # fmt: skip
    return shell(f"MechSandbox run: {run.name}", body, scripts=("runs.js",), inline=inline)


def runs_index(folders: Mapping[str, str], board: Mapping[str, Any] | None, board_error: str = "") -> str:
    """/web/runs: the leaderboard from the results database (when the server has one) and the operator's run
    folders, each linking to its page."""
    parts = []
    if board_error:
        parts.append(f'<p class="status error">{esc(board_error)}</p>')
    if board is not None:
        parts.append("<h2>Leaderboard (results database)</h2>")
        groups = board.get("groups") or []
        if not groups:
            parts.append('<p class="muted">no runs registered on this server</p>')
        for group in groups:
            rows = [
                f'<tr>{cell(r.get("rank", ""))}<td><a href="/web/runs/db/{esc(r["run_id"])}">{esc(r["run_id"])}'
                f'</a></td>{cell(_submitter(r))}'
                f'{cell(r.get("agent", ""))}{cell(r.get("model") or "")}{_board_cell(r["overall"], r["ci95"])}'
                f'{cell(r.get("episodes"), num=True)}{cell(_run_status(r))}</tr>'
                for r in board.get("runs", []) if r.get("group") == group.get("group")
            ]  # fmt: skip
            title = "current test set and versions" if group.get("current") else "another test set or family versions"
            title += "; a public salt: listed, not ranked" if group.get("public_salt") else ""
            parts.append(f'<p class="muted">group {esc(group.get("group", ""))}: {title}</p>')
            headers = ["rank", "run", "submitter (finished runs)", "agent", "model", "overall [95% interval]",
                       "episodes", "status"]
            parts.append(table(headers, rows, css="board"))
    parts.append("<h2>Run folders</h2>")
    if folders:
        parts.append("<ul>" + "".join(f'<li><a href="/web/runs/dir/{esc(name)}">{esc(name)}</a> '
                                      f'<span class="muted">{esc(path)}</span></li>' for name, path in folders.items())
                     + "</ul>")  # fmt: skip
    else:
        parts.append('<p class="muted">none: set MECHSANDBOX_RUN_DIRS to eval output folders (or folders of them)</p>')
    return shell("MechSandbox runs", "".join(parts))


def _submitter(entry: Mapping[str, Any]) -> str:
    return f"{entry.get('submitter', '')} ({entry.get('submitter_finished_runs', 0)})"


def _run_status(entry: Mapping[str, Any]) -> str:
    if entry.get("status") in ("sealed", "withdrawn"):
        return str(entry["status"])
    return "complete" if entry.get("complete") else "partial"


def db_run_page(run_id: str, entry: Mapping[str, Any], folder: str | None) -> str:
    """A database run: its counted means per family with Wilson intervals (the leaderboard's numbers); trajectories
    live only in run folders, linked when one holds this run."""
    families = sorted((entry.get("families") or {}).items())
    levels = [lv for lv in LEVELS if any(lv in v.get("levels", {}) for _, v in families)]
    rows = []
    for family, v in families:
        by_level = "".join(_board_cell(v["levels"][lv]["mean"], v["levels"][lv]["ci95"]) if lv in v.get("levels", {})
                           else cell("-") for lv in levels)  # fmt: skip
        total = _board_cell(v["mean"], v["ci95"]) + cell(v["episodes"], num=True)
        rows.append(f"<tr>{cell(family)}{by_level}{total}</tr>")
    link = (f'<p><a href="/web/runs/dir/{esc(folder)}">episodes and figures (run folder {esc(folder)})</a></p>'
            if folder else '<p class="muted">no run folder of this run is configured (MECHSANDBOX_RUN_DIRS)</p>')
    facts = " &middot; ".join(f"{esc(k)} <b>{esc(entry.get(k))}</b>" for k in ("agent", "model", "status", "overall",
                                                                               "episodes")
                              if entry.get(k) is not None)  # fmt: skip
    headers = ["family", *levels, "all levels [95% interval]", "counted episodes"]
    body = f'<p class="muted">{facts}</p>{table(headers, rows, "summary")}{link}'
    return shell(f"MechSandbox run: {run_id}", body)


def playground_page(families: list[Mapping[str, Any]], token_required: bool) -> str:
    """/web: pick a family, level, split and seed (or test index), read the prompt and the answer schema, run
    snippets, submit, see the score (and on train the truth and the feedback). The page is a shell; the script
    plays through POST /reset and /step."""
    import json

    catalogue = json.dumps([{"id": f["id"], "levels": f["levels"]} for f in families]).replace("<", "\\u003c")
    options = "".join(f'<option value="{esc(f["id"])}">{esc(f["id"])}</option>' for f in families)
    token = ('<label>bearer token<input id="token" type="password" autocomplete="off" size="18"></label>'
             if token_required else "")  # fmt: skip
    body = f"""
<script type="application/json" id="catalogue">{catalogue}</script>
<div class="row">
 <label>family<select id="family">{options}</select></label>
 <label>level<select id="level"></select></label>
 <label>split<select id="split"><option value="train">train</option><option value="test">test</option></select></label>
 <label id="seed-label">seed (empty: random)<input id="seed" type="number" min="0" size="8"></label>
 <label id="index-label">test index<input id="index" type="number" min="0" value="0" size="6"></label>
 {token}<button id="start">Start episode</button>
</div>
<p class="status" id="status">pick a task and start an episode</p>
<section id="episode" hidden>
 <p class="muted" id="episode-info"></p>
 <div class="cols">
  <div><h2>Task</h2><pre id="prompt"></pre><h2>Answer schema</h2><pre id="schema"></pre></div>
  <div>
   <h2>Snippet</h2>
   <div class="muted">names (click to insert): <span id="names"></span></div>
   <textarea id="code" spellcheck="false">print(model)</textarea>
   <div class="row"><button id="run">Run (Ctrl+Enter)</button>
    <span class="muted">print a line <code>@heatmap {{"title": "...", "z": [[...]]}}</code> (e.g. with
    <code>json.dumps</code>) to draw a small matrix</span></div>
   <h2>Answer</h2>
   <textarea id="answer" spellcheck="false" style="min-height: 70px"></textarea>
   <div class="row"><button id="submit" class="secondary">Submit answer (graded once)</button></div>
   <div id="result"></div>
  </div>
 </div>
 <h2>Steps (newest first)</h2><div id="log"></div>
</section>"""
    return shell("MechSandbox playground", body, scripts=("playground.js",))
