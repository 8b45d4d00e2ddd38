"""A short soak (about 30 s): 16 HTTP sessions, 4 of them hostile (~10% of all steps). No 5xx, no
well-behaved session loses its namespace or is graded wrong, no leaked workers or zombies, and the
server's memory does not keep growing."""

from __future__ import annotations

from mechsandbox.evaluation.soak import run_soak
from server_harness import running_server


def test_short_soak(tmp_path) -> None:
    # hostile snippets that block without using CPU now run to the wall-clock backstop (the limit is CPU time since
    # issue 52): a short backstop keeps them cycling within the soak's 30 s
    env = {"MECHSANDBOX_WALL_SECONDS": "2", "MECHSANDBOX_WALL_BACKSTOP_SECONDS": "3", "MECHSANDBOX_POOL_SIZE": "4"}
    with running_server(tmp_path, **env) as server:
        report = run_soak(server.url, server.process.pid, seconds=30, sessions=16, hostile=4)
    assert report.steps > 100 and report.hostile_steps > 0.05 * report.steps
    assert report.server_errors == 0
    assert report.well_behaved_resets == 0 and report.wrongly_graded == 0 and report.episodes_graded > 10
    assert not report.other_failures, report.other_failures[:3]
    start, middle, end = report.samples[0], report.samples[len(report.samples) // 2], report.samples[-1]
    assert end["zombies"] == 0
    assert start["processes"] >= 2 and end["processes"] <= 1 + 4  # the zygote and the warm pool (4) only
    assert end["server_rss"] - middle["server_rss"] < 64 * 2**20
