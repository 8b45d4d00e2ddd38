"""``mechsandbox eval``: output shapes, a small calibration run (scripted vs random), argument errors."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from mechsandbox.agents import ScriptedAgent
from mechsandbox.cli import main as cli_main
from mechsandbox.evaluation import cli as eval_cli
from mechsandbox.evaluation.harness import Plan, run_plan
from mechsandbox.evaluation.report import markdown, summarise
from mechsandbox.results import wilson_interval
from server_harness import RunningServer, running_server

CLI = [sys.executable, "-m", "mechsandbox.cli", "eval"]
ROW_KEYS = {"task_id", "family_version", "level", "split", "instance_id", "score", "steps", "rewards", "seconds",
            "error", "infra_error", "attempts"}
INFRA_KEYS = {"infrastructure_errors", "infrastructure_by_side", "infrastructure_by_task"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A random-salt server: its test scores are shown per episode (a fixed salt seals them until a run finishes,
    issue 55), which the calibration, the report and the comparisons below read."""
    with running_server(tmp_path_factory.mktemp("eval")) as s:
        yield s


@pytest.fixture(scope="module")
def counted(tmp_path_factory) -> Iterator[tuple[RunningServer, dict]]:
    """A fixed-salt server and one scripted eval on it: a sealed run that eval finishes at the end."""
    with running_server(tmp_path_factory.mktemp("counted"), MECHSANDBOX_TEST_SALT="eval-tests-salt-0123456789abcdef",
                        MECHSANDBOX_STANDARD_SET="2") as s:  # fmt: skip
        path = tmp_path_factory.mktemp("counted-run")
        cmd = [*CLI, "--agent", "scripted", "--tasks", "dead-neurons,copy-head", "--level", "easy,hard",
               "--episodes", "2", "--url", s.url, "--concurrency", "2", "--out", str(path)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "finished: published overall" in done.stderr
        summary = json.loads((path / "summary.json").read_text())
        # sealed attempts have no score here: in no mean, counted apart, the run's published result said instead
        assert summary["sealed_episodes"] == 8 and summary["overall"]["episodes"] == 0
        assert "8 sealed counted attempts" in (path / "summary.md").read_text()
        yield s, summary["run"]


@pytest.fixture(scope="module")
def runs(server, tmp_path_factory) -> dict[str, Path]:
    out = {}
    for agent in ("scripted", "random"):
        path = tmp_path_factory.mktemp(agent)
        cmd = [*CLI, "--agent", agent, "--tasks", "dead-neurons,copy-head,task3", "--level", "easy,hard",
               "--episodes", "3", "--url", server.url, "--concurrency", "2", "--out", str(path)]  # fmt: skip
        if agent == "random":
            cmd += ["--compare", str(out["scripted"])]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "episodes, mean score" in done.stdout and "; 0 infrastructure errors;" in done.stdout
        out[agent] = path
    return out


def test_output_files_have_the_documented_shapes(runs) -> None:
    path = runs["scripted"]
    rows = [json.loads(line) for line in (path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2 * 3 and all(set(r) >= ROW_KEYS for r in rows)
    assert all(r["split"] == "test" and r["instance_id"].startswith("test-") and r["rewards"] for r in rows)
    assert len(list((path / "trajectories").glob("*.json"))) == len(rows)
    trajectory = json.loads(next((path / "trajectories").glob("*.json")).read_text())
    assert trajectory["turns"] and {"action", "reward", "output"} <= set(trajectory["turns"][0])
    summary = json.loads((path / "summary.json").read_text())
    assert set(summary) == {"tasks", "overall", "run", "sealed_episodes", *INFRA_KEYS}
    assert summary["infrastructure_errors"] == 0
    assert summary["sealed_episodes"] == 0  # a random-salt server seals nothing
    task = summary["tasks"]["fourier-frequencies"]
    assert set(task) >= {"mean_score", "interval95", "ci95", "episodes", "solved", "mean_steps", "levels", "family_version"}  # noqa: E501
    assert set(task["levels"]) == {"easy", "hard"} and task["levels"]["hard"]["episodes"] == 3
    assert set(summary["overall"]) == {"mean_score", "interval95", "ci95", "episodes", "solved"}
    assert summary["overall"]["episodes"] == 18
    run = summary["run"]
    assert {"agent", "model", "temperature", "prompt_version", "git_commit", "benchmark_version"} <= set(run)
    assert run["salt"] == "random" and len(run["salt_fingerprint"]) == 12 and "run_id" not in run  # no run: random
    assert sorted(run["instance_ids"]) == sorted(r["instance_id"] for r in rows)
    assert len(run["instances"]) == 18 and "copy-head/hard/test:2" in run["instances"]
    assert "| copy-head |" in (path / "summary.md").read_text()
    assert summary["overall"]["interval95"][0] < summary["overall"]["mean_score"] <= summary["overall"]["interval95"][1]
    for name in ("scores", "levels", "steps"):
        png = (path / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 20_000, name  # 200 dpi
        assert (path / f"{name}.svg").read_text().startswith("<?xml"), name


def test_small_calibration(runs) -> None:
    scripted = json.loads((runs["scripted"] / "summary.json").read_text())
    random = json.loads((runs["random"] / "summary.json").read_text())
    for task_id, entry in scripted["tasks"].items():
        assert entry["mean_score"] >= 0.95, task_id
        assert entry["mean_score"] - random["tasks"][task_id]["mean_score"] >= 0.7, task_id
    assert random["overall"]["mean_score"] <= 0.2


def test_runs_on_a_fixed_salt_server_land_on_its_leaderboard(counted) -> None:
    server, scripted = counted
    with server.http() as http:
        entry = http.get(f"/runs/{scripted['run_id']}").json()
    assert entry["agent"] == "scripted" and entry["status"] == "finished" and entry["complete"] is False
    assert entry["coverage"]["attempted"] == 8 and entry["episodes"] == 12 * 3 * 2  # the whole standard set
    published = scripted["published"]  # what eval wrote into summary.json when it finished the run
    assert published["overall"] == entry["overall"] and published["families"] == entry["families"]
    shown = subprocess.run([sys.executable, "-m", "mechsandbox.cli", "leaderboard", "--url", server.url],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if scripted["run_id"] in line)
    assert "scripted" in line and "partial" in line and f"{entry['overall']:.2f}" in line


def test_the_leaderboard_links_each_run_to_its_page(counted) -> None:
    """GET /leaderboard names each run's page in the run viewer; the page shows the published numbers per family,
    and /web/runs lists the run."""
    server, scripted = counted
    with server.http() as http:
        entry = next(r for r in http.get("/leaderboard").json()["runs"] if r["run_id"] == scripted["run_id"])
        assert entry["page"] == f"/web/runs/db/{scripted['run_id']}"
        page = http.get(entry["page"])
        assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
        low, high = entry["families"]["copy-head"]["ci95"]
        assert f"{entry['families']['copy-head']['mean']} [{low}, {high}]" in page.text
        assert f'href="{entry["page"]}"' in http.get("/web/runs").text


def test_compare_refuses_runs_on_other_instances(server, runs, tmp_path) -> None:
    cmd = [*CLI, "--agent", "random", "--tasks", "dead-neurons", "--level", "easy", "--episodes", "2",
           "--url", server.url, "--out", str(tmp_path), "--compare", str(runs["scripted"])]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "refusing to compare" in done.stderr
    assert "16 only in it" in done.stderr and not (tmp_path / "results.jsonl").exists()
    forced = subprocess.run([*cmd, "--force-compare"], capture_output=True, text=True, timeout=300)
    assert forced.returncode == 0 and "warning (--force-compare)" in forced.stderr


def test_compare_refuses_other_versions() -> None:
    from mechsandbox.evaluation.compare import difference

    this = {"split": "test", "salt_fingerprint": "fp", "benchmark_version": "0.1.0", "family_versions": {"t": "2"},
            "instances": ["t/easy/test:0"]}  # fmt: skip
    assert difference(dict(this), this) is None
    assert "family versions: t 1 vs 2" in difference({**this, "family_versions": {"t": "1"}}, this)  # type: ignore[operator]
    assert "benchmark 0.0.9" in difference({**this, "benchmark_version": "0.0.9"}, this)  # type: ignore[operator]
    assert "another test set" in difference({**this, "salt_fingerprint": "other"}, this)  # type: ignore[operator]
    assert "rerun it" in difference({"split": "test"}, this)  # type: ignore[operator]


def test_train_split_with_seed_range(server, tmp_path) -> None:
    cmd = [*CLI, "--agent", "random", "--tasks", "dead-neurons", "--level", "easy", "--split", "train",
           "--seeds", "10-12", "--url", server.url, "--out", str(tmp_path)]  # fmt: skip
    assert subprocess.run(cmd, capture_output=True, text=True, timeout=300).returncode == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted(r["instance_id"] for r in rows) == [f"train-dead-neurons-easy-{s}" for s in (10, 11, 12)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent", "random", "--tasks", "nope"], "unknown"),
        (["--agent", "random", "--level", "extreme"], "unknown level"),
        (["--agent", "random", "--seeds", "1-3"], "--seeds is for --split train"),
    ],
)
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, args: list[str], message: str) -> None:
    """The CLI's own entry point, in this process: a subprocess paid 6-7 s of imports per case for the same code."""
    assert cli_main(["eval", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_summary_statistics() -> None:
    rows = [{"task_id": "t", "level": "easy", "score": s, "steps": 2, "family_version": "1"} for s in (0.2, 0.4)]
    summary = summarise(rows, {"agent": "x", "split": "test"})
    entry = summary["tasks"]["t"]
    assert entry["mean_score"] == pytest.approx(0.3) and entry["ci95"] == pytest.approx(1.96 * 0.14142 / 2**0.5, 1e-3)
    assert entry["interval95"] == list(wilson_interval(0.3, 2)) and entry["solved"] == 0
    assert "| t | 1 | 0.300 | 0.300 [" in markdown(summary)  # only the levels that were run get a column
    capped = summarise([{**rows[0], "score": 0.99}] * 3, {"agent": "x"})["overall"]
    assert capped["ci95"] == 0 and capped["interval95"][0] < 0.9 and capped["solved"] == 3  # not zero-width at the cap


def test_starts_its_own_server_without_url(tmp_path) -> None:
    cmd = [*CLI, "--agent", "random", "--tasks", "dead-neurons", "--level", "easy", "--episodes", "2",
           "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "server.log").exists()
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["error"] is None and r["instance_id"].startswith("test-") for r in rows)
    assert "random test salt" in done.stderr  # its own server's scores are comparable with nothing
    assert json.loads((tmp_path / "summary.json").read_text())["run"]["salt"] == "random"


REPORT = [sys.executable, "-m", "mechsandbox.cli", "report"]


def test_report_draws_the_figures_and_a_page_from_the_run(runs, tmp_path) -> None:
    """``mechsandbox report``: the table, figures with intervals, n, the baseline and only the levels run, and a
    self-contained page whose numbers are summary.json's."""
    page = tmp_path / "report.html"
    cmd = [*REPORT, str(runs["scripted"]), "--compare", str(runs["random"]), "--html", str(page),
           "--figures", str(tmp_path / "figures")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((runs["scripted"] / "summary.json").read_text())
    assert done.stdout == (runs["scripted"] / "summary.md").read_text()
    scores = (tmp_path / "figures" / "scores.svg").read_text()
    assert "<!-- n = 6 -->" in scores and "95% Wilson interval" in scores and "baseline: random" in scores
    assert "<!-- fourier-frequencies -->" in scores  # task3's full name, never cut
    levels = (tmp_path / "figures" / "levels.svg").read_text()
    assert "<!-- easy (9 episodes) -->" in levels and "<!-- hard (9 episodes) -->" in levels and "medium" not in levels
    assert "solved -->" in (tmp_path / "figures" / "steps.svg").read_text()
    assert len((tmp_path / "figures" / "scores.png").read_bytes()) > 20_000
    text = page.read_text()
    low, high = summary["overall"]["interval95"]
    assert f"{summary['overall']['mean_score']:.3f} [{low:.3f}, {high:.3f}] (n=18)" in text
    assert "<script src=" not in text  # scripts inlined: opens anywhere
    assert text.count('class="episode"') == 0 and "test answers" in text  # a test run's episodes are never shown
    refused = subprocess.run([*REPORT, str(runs["scripted"]), "--compare", str(tmp_path)], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and "no summary.json" in refused.stderr


def _run_folder(path: Path, rows: list[dict], summary: object | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is None:
        summary = summarise([{**r, "score": 0.5} for r in rows], {"agent": "x"})  # a score that is no number
    text = summary if isinstance(summary, str) else json.dumps(summary)
    (path / "summary.json").write_text(text)
    return path


ROW = {"task_id": "copy-head", "level": "easy", "score": 0.99, "steps": 3, "family_version": "3"}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "absent", "no such directory"),
        (lambda p: _run_folder(p / "empty", [], {"tasks": {}, "overall": {"episodes": 0}}), "the run has no episodes"),
        (lambda p: _run_folder(p / "corrupt", [ROW], "{not json"), "summary.json: not valid JSON"),
        (lambda p: _run_folder(p / "rows", [{"task_id": "x"}], {"tasks": {}, "overall": {}}), "line 1 lacks one of"),
        (lambda p: (p / "file").write_text("x") and p / "file", "not a directory"),
        (lambda p: _run_folder(p / "score", [{**ROW, "score": "high"}]), "line 1 has a score outside [0, 1]"),
        (lambda p: _run_folder(p / "edited", [ROW], summarise([{**ROW, "score": 0.5}], {})), "disagree with results"),
    ],
)
def test_report_refuses_an_unusable_run_in_one_line(tmp_path, capsys, make, message: str) -> None:
    from mechsandbox.cli import main  # in-process: the CLI's own code path, without a Python start per case

    assert main(["report", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_summary_from_before_the_intervals_is_recomputed_by_the_same_code(tmp_path) -> None:
    from mechsandbox.evaluation.rundir import load_run

    old = summarise([ROW, {**ROW, "score": 0.01}], {"agent": "old"})
    for entry in (old["overall"], *old["tasks"].values()):
        entry.pop("interval95")
    run = load_run(_run_folder(tmp_path / "old", [ROW, {**ROW, "score": 0.01}], old))
    assert run.summary["overall"]["interval95"] == list(wilson_interval(0.5, 2))


# -- infrastructure errors: a named outcome, never a score ----------------------------------------------------------


class KillsTheServer(ScriptedAgent):
    """The scripted agent, except that in the ``kill_in``-th episode it begins it kills the server (SIGKILL, as a
    crash or an OOM kill would) before its first step: a real failure that is not the agent's, mid-episode.
    ``then`` runs after the kill (a test may start a server again on the same port)."""

    server: ClassVar[Any] = None
    kill_in: ClassVar[int] = 0
    begun: ClassVar[int] = 0
    then: ClassVar[Any] = None

    def begin(self, obs: dict[str, Any]) -> None:
        super().begin(obs)
        KillsTheServer.begun += 1
        self.kills = KillsTheServer.begun == KillsTheServer.kill_in

    def next_turn(self, obs: dict[str, Any]) -> Any:
        if self.kills:
            self.kills = False
            KillsTheServer.server.process.kill()
            KillsTheServer.server.process.wait(timeout=30)
            if KillsTheServer.then is not None:
                KillsTheServer.then()
        return super().next_turn(obs)


def eval_args(url: str, out: Path, **changes: Any) -> argparse.Namespace:
    """``mechsandbox eval``'s arguments, as its parser makes them, for ``run_eval`` in this process."""
    args = {"agent": "scripted", "tasks": "dead-neurons", "level": "easy", "split": "train", "seeds": None,
            "episodes": 4, "url": [url], "concurrency": 1, "compare": [], "force_compare": False, "run": None,
            "out": str(out), "retries": 1}  # fmt: skip
    return argparse.Namespace(**{**args, **changes})


def test_eval_over_a_server_killed_mid_run_counts_infrastructure_errors_apart(tmp_path, monkeypatch, capsys) -> None:
    """The server dies in the third of four episodes: the two graded episodes make the mean (n = 2); the two it lost
    (one mid-episode, one that could not connect) are infrastructure errors, retried and still lost, with no score,
    counted in the final line, summary.json and the first line of summary.md; eval exits 1."""
    monkeypatch.setattr(eval_cli, "ScriptedAgent", KillsTheServer)
    with running_server(tmp_path) as doomed:
        KillsTheServer.server, KillsTheServer.kill_in, KillsTheServer.begun, KillsTheServer.then = doomed, 3, 0, None
        code = eval_cli.run_eval(eval_args(doomed.url, tmp_path / "out"))
    out, err = capsys.readouterr()
    assert code == 1, err[-2000:]
    assert "2 episodes, mean score 0.9" in out and "; 2 infrastructure errors;" in out
    assert "2 infrastructure errors (connection 2)" in err
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [r["score"] is None for r in rows] == [False, False, True, True]
    lost = rows[2]["infra_error"]
    assert lost["side"] == "connection" and lost["message"].startswith("infrastructure error (connection): ")
    assert [r["attempts"] for r in rows] == [1, 1, 2, 2]  # train: each lost episode played once more
    assert all(r["error"] is None for r in rows)  # not the agent's failure
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["infrastructure_errors"] == 2 and summary["infrastructure_by_side"] == {"connection": 2}
    assert summary["infrastructure_by_task"] == {"dead-neurons": 2}
    assert summary["overall"]["episodes"] == 2 and summary["overall"]["mean_score"] >= 0.95
    assert summary["tasks"]["dead-neurons"]["episodes"] == 2
    first = (tmp_path / "out" / "summary.md").read_text().splitlines()[2]
    assert "2 infrastructure errors" in first and "over the 2 graded episodes" in first
    from mechsandbox.evaluation.rundir import load_run

    assert load_run(tmp_path / "out").summary["infrastructure_errors"] == 2  # the report reads it back


def test_a_retried_train_episode_that_then_succeeds_counts_once(tmp_path) -> None:
    """The server dies mid-episode and comes back on the same address: the train episode is played again from a
    fresh reset, graded, and is one row, once in the mean."""
    doomed = RunningServer(env={"MECHSANDBOX_POOL_SIZE": "2"}, log_path=tmp_path / "first.log", startup_s=90)
    again = RunningServer(env={"MECHSANDBOX_POOL_SIZE": "2"}, log_path=tmp_path / "again.log", startup_s=90)
    again.port, again.url = doomed.port, doomed.url
    starting = threading.Thread(target=again.start, daemon=True)
    KillsTheServer.server, KillsTheServer.kill_in, KillsTheServer.begun = doomed, 1, 0
    KillsTheServer.then = starting.start
    plan = Plan(["dead-neurons"], ["easy"], "train", 1, range(5, 6))
    try:
        with doomed:
            records = run_plan(plan, doomed.url, lambda i: KillsTheServer(), concurrency=1, progress=False,
                               retries=4, backoff_s=2.0)  # fmt: skip
    finally:
        KillsTheServer.then = None
        starting.join(timeout=120)
        again.stop()
    [record] = records
    assert record.infra_error is None and record.error is None and record.attempts >= 2
    assert record.score is not None and record.score >= 0.95 and record.instance_id == "train-dead-neurons-easy-5"
    summary = summarise([r.result_row() for r in records], {"agent": "scripted"})
    assert summary["overall"]["episodes"] == 1 and summary["infrastructure_errors"] == 0


def test_summary_means_leave_out_infrastructure_errors() -> None:
    graded = {"task_id": "t", "level": "easy", "score": 0.8, "steps": 2, "family_version": "1"}
    lost = {**graded, "score": None, "infra_error": {"side": "sandbox", "message": "x", "started": True}}
    summary = summarise([graded, lost, {**lost, "task_id": "u"}], {"agent": "x"})
    assert summary["overall"]["episodes"] == 1 and summary["overall"]["mean_score"] == pytest.approx(0.8)
    assert set(summary["tasks"]) == {"t"} and summary["tasks"]["t"]["episodes"] == 1  # u: no graded episode
    assert summary["infrastructure_errors"] == 2 and summary["infrastructure_by_side"] == {"sandbox": 2}
    assert summary["infrastructure_by_task"] == {"t": 1, "u": 1}
    assert markdown(summary).splitlines()[2].startswith("**2 infrastructure errors (sandbox 2)")
