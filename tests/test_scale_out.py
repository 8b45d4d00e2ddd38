"""Scale-out (issue 21): two real ``mechsandbox serve`` replicas sharing one real PostgreSQL and one test salt,
behind Debian's HAProxy running the configuration ``deploy/`` ships (``loadbalancer.haproxy_config``), all on
loopback (``evaluation/cluster.py``).

What must hold: HTTP episodes come back to the replica that holds them (by the tag in their episode_id) and a
foreign or malformed id gets a clear 4xx; ``mechsandbox eval`` through the balancer with 32 sessions completes
every episode; a draining replica finishes its episodes and leaves rotation; a killed replica fails only its own
sessions, with a clear error, and the database holds no wrong and no double-counted score.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from mechsandbox.agents import ScriptedAgent
from mechsandbox.evaluation.cluster import LocalCluster
from mechsandbox.evaluation.harness import Plan, run_plan
from mechsandbox.loadbalancer import Replica, haproxy_config
from mechsandbox.results import ResultStore
from postgres_harness import Postgres, postgres_or_skip

SALT = "scale-out-salt-0123456789abcdef"
REPO = Path(__file__).resolve().parents[1]
CODE = {"python_code": "print(6 * 7)"}
NOTICE_S = 1.5  # MECHSANDBOX_DRAIN_NOTICE_S of the draining test


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with postgres_or_skip() as server:
        yield server


def cluster_env(postgres: Postgres, **extra: str) -> dict[str, str]:
    return {"MECHSANDBOX_TEST_SALT": SALT, "MECHSANDBOX_DATABASE_URL": postgres.url, "MECHSANDBOX_CLIENT_SHARE": "1",
            "MECHSANDBOX_POOL_SIZE": "4", "MECHSANDBOX_PREFETCH_DEPTH": "0", "MECHSANDBOX_STANDARD_SET": "48",
            **extra}  # fmt: skip


def cluster_or_skip(postgres: Postgres, **extra: str) -> LocalCluster:
    try:
        return LocalCluster(2, cluster_env(postgres, **extra))
    except FileNotFoundError as exc:
        pytest.skip(f"{exc}; .ci/run installs it")


def reset_on(http: httpx.Client, replica: str, **body: object) -> str:
    """An HTTP episode through the balancer that landed on ``replica`` (the others are stepped to an end)."""
    for _ in range(20):
        http.cookies.clear()  # no stickiness: let the balancer choose
        response = http.post("/reset", json={"task_id": "dead-neurons", **body})
        assert response.status_code == 200, response.text
        episode = response.json()["episode_id"]
        if episode.startswith(f"{replica}."):
            return episode
        http.post("/step", json={"episode_id": episode, "action": {"solution_target": []}})
    pytest.fail(f"20 resets through the balancer never reached {replica}")


def test_the_shipped_deployments_match_the_generator() -> None:
    """deploy/'s balancer configs are the generator's text for the replicas its compose file and Kubernetes
    manifests start, and HAProxy itself accepts them (when installed)."""
    deploy = REPO / "deploy"
    services = yaml.safe_load((deploy / "compose.yaml").read_text())["services"]
    names = sorted(s["environment"]["MECHSANDBOX_REPLICA_ID"] for s in services.values()
                   if "MECHSANDBOX_REPLICA_ID" in s.get("environment", {}))  # fmt: skip
    assert (deploy / "haproxy.cfg").read_text() == haproxy_config([Replica(n, f"{n}:8000") for n in names])
    manifests = {d["kind"] + "/" + d["metadata"]["name"]: d for d in yaml.safe_load_all(
        (deploy / "kubernetes" / "mechsandbox.yaml").read_text())}  # fmt: skip
    pods = [f"mechsandbox-{k}" for k in range(manifests["StatefulSet/mechsandbox"]["spec"]["replicas"])]
    kube = haproxy_config([Replica(p, f"{p}.mechsandbox.default.svc.cluster.local:8000") for p in pods])
    assert (deploy / "kubernetes" / "haproxy.cfg").read_text() == kube
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if Path(haproxy).exists():
        for cfg in (deploy / "haproxy.cfg", deploy / "kubernetes" / "haproxy.cfg"):
            check = subprocess.run([haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=60)
            assert check.returncode == 0, check.stderr
    text = haproxy_config([Replica("r1", "10.0.0.1:8000"), Replica("r2", "10.0.0.2:8000")])
    assert "use-server r1 if { var(txn.replica) -m str r1 }" in text and "resolvers" not in text
    assert "force-persist" not in text and "http-check disable-on-404" in text  # see loadbalancer.py
    for bad in ("r_1=host:1", "r1=host", "r1:8000", "r1.x=host:1", "r1=a\n server x 1.2.3.4:80:8000", "r1=h st:1"):
        with pytest.raises(ValueError):
            Replica.parse(bad)
    with pytest.raises(ValueError, match="repeat"):
        haproxy_config([Replica("r1", "a:1"), Replica("r1", "b:1")])


def test_routing_eval_at_32_sessions_and_draining(postgres: Postgres, tmp_path) -> None:
    cluster = cluster_or_skip(postgres, MECHSANDBOX_DRAIN_S="60", MECHSANDBOX_DRAIN_NOTICE_S=str(NOTICE_S))
    with cluster, httpx.Client(base_url=cluster.url, timeout=120) as http:
        r1, r2 = (httpx.Client(base_url=s.url, timeout=60) for s in cluster.servers)
        # HTTP episodes: ids carry their replica's tag, and /step and /state come back to it through the balancer
        tags = set()
        for seed in range(6):
            http.cookies.clear()
            episode = http.post("/reset", json={"task_id": "dead-neurons", "seed": seed}).json()["episode_id"]
            tags.add(episode.partition(".")[0])
            step = http.post("/step", json={"episode_id": episode, "action": CODE})
            assert step.status_code == 200 and step.json()["observation"]["stdout_or_error"] == "42\n", step.text
            state = http.get("/state", params={"episode_id": episode})
            assert state.status_code == 200 and state.json()["episode_id"] == episode
            http.post("/step", json={"episode_id": episode, "action": {"solution_target": []}})  # ends it
        assert tags == {"r1", "r2"}
        # an id of another replica or a malformed one: a clear 4xx, from the replica it reached
        foreign = reset_on(http, "r2", seed=1)
        wrong = r1.post("/step", json={"episode_id": foreign, "action": CODE})
        detail = wrong.json()["detail"]
        assert wrong.status_code == 421 and "replica 'r2'" in detail and "replica 'r1'" in detail
        assert r1.get("/state", params={"episode_id": foreign}).status_code == 421
        gone = http.post("/step", json={"episode_id": "r9.no-such-replica", "action": CODE})
        assert gone.status_code == 421 and "replica 'r9'" in gone.json()["detail"]
        for malformed in ("r2.not-an-episode", "no-dot-at-all", "..", "!!.x"):
            response = http.post("/step", json={"episode_id": malformed, "action": CODE})
            assert response.status_code == 404 and "unknown or expired episode_id" in response.json()["detail"]
        http.post("/step", json={"episode_id": foreign, "action": {"solution_target": []}})
        assert http.post("/step", json={"action": CODE}).status_code in (400, 422)
        assert http.post("/step", content=b"{not json", headers={"content-type": "application/json"}).status_code < 500

        # `mechsandbox eval` through the balancer: a run registered on one replica, 32 test episodes at once
        out = tmp_path / "eval"
        done = subprocess.run(
            [sys.executable, "-m", "mechsandbox.cli", "eval", "--agent", "scripted", "--tasks", "dead-neurons",
             "--level", "easy", "--split", "test", "--episodes", "32", "--concurrency", "32", "--url", cluster.url,
             "--run", "through-the-balancer", "--out", str(out)],
            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        episodes = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        # counted attempts on the cluster's fixed salt are sealed: no score on the client, graded in the database
        bad = [(e["error"], e.get("infra_error")) for e in episodes if e.get("error") or e.get("infra_error")]
        assert len(episodes) == 32 and not bad and all(e["sealed"] and e["score"] is None for e in episodes), bad[:3]
        store = ResultStore(postgres.url).open(migrate=False)
        try:
            run = next(r for r in store.runs() if r.agent == "through-the-balancer")
            attempts = store.attempts(run.run_id)
        finally:
            store.close()
        assert len(attempts) == 32 and {a.status for a in attempts} == {"graded"}
        assert all(a.score >= 0.9 for a in attempts)
        assert sorted(a.instance_id for a in attempts) == sorted(e["instance_id"] for e in episodes)

        # a /step larger than a balancer buffer... is not: 128 KiB holds it; a 20 KB snippet with the action first
        big = reset_on(http, "r2", seed=4)
        code = "x = 1\n" * 3500 + "print(6 * 7)"
        body = json.dumps({"action": {"python_code": code}, "episode_id": big})
        step = http.post("/step", content=body, headers={"content-type": "application/json"})
        assert len(body) > 20_000 and step.status_code == 200, step.text
        assert step.json()["observation"]["stdout_or_error"] == "42\n"
        step = http.post("/step", params={"episode_id": big}, json={"episode_id": big, "action": CODE})
        assert step.status_code == 200, step.text
        other = http.post("/step", params={"episode_id": foreign}, json={"episode_id": big, "action": CODE})
        assert other.status_code == 400 and "differ" in other.json()["detail"]
        http.post("/step", json={"episode_id": big, "action": {"solution_target": []}})

        # draining: r2 leaves rotation at once (/health 503, /ready 404), refuses new episodes after the notice,
        # still gets its live episode's steps through the balancer, and stops by itself once that episode ends
        live = reset_on(http, "r2", seed=3)
        cluster.servers[1].process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while r2.get("/health").json()["status"] != "draining" and time.monotonic() < deadline:
            time.sleep(0.05)
        health = r2.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert health.json()["live_episodes"] == 1
        assert r2.get("/ready").status_code == 404 and r1.get("/ready").status_code == 200
        time.sleep(max(4 * cluster.check_s, NOTICE_S))  # two failed checks; the notice is over
        refused = r2.post("/reset", json={"task_id": "dead-neurons"})
        assert refused.status_code == 503 and "draining" in refused.json()["detail"]
        for _ in range(6):
            http.cookies.clear()
            assert http.post("/reset", json={"task_id": "dead-neurons"}).json()["episode_id"].startswith("r1.")
        step = http.post("/step", json={"episode_id": live, "action": CODE})  # still routed to r2 by its tag
        assert step.status_code == 200 and step.json()["observation"]["stdout_or_error"] == "42\n"
        assert cluster.servers[1].process.poll() is None  # the episode is live: r2 waits
        http.post("/step", json={"episode_id": live, "action": {"solution_target": []}})
        assert cluster.servers[1].process.wait(timeout=30) == 0
        r1.close()
        r2.close()


def test_a_killed_replica_fails_only_its_own_sessions(postgres: Postgres) -> None:
    with cluster_or_skip(postgres) as cluster:
        killed = cluster.servers[1]
        register = httpx.post(f"{cluster.url}/runs", json={"agent": "killed-mid-run"}, timeout=60)
        assert register.status_code == 200, register.text
        run = register.json()
        plan = Plan(tasks=[], levels=[], split="test")
        plan.resets = [{"task_id": "dead-neurons", "level": "easy", "split": "test", "index": i,
                        "run_token": run["run_token"]} for i in range(48)]  # fmt: skip

        def kill_when_busy() -> None:
            with httpx.Client(base_url=killed.url, timeout=10) as http:
                deadline = time.monotonic() + 120
                while http.get("/health").json()["live_episodes"] < 1 and time.monotonic() < deadline:
                    time.sleep(0.02)
            killed.process.send_signal(signal.SIGKILL)

        with httpx.Client(base_url=cluster.url, timeout=60) as http:
            orphan = reset_on(http, "r2", seed=7)  # an HTTP episode on the replica that will die
        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        records = run_plan(plan, cluster.url, lambda i: ScriptedAgent(), concurrency=16, progress=False)
        killer.join()
        assert killed.process.poll() is not None
        # the killed replica's episodes are the infrastructure's (a named side, no score); the rest were graded and
        # sealed (the cluster's salt is fixed): their scores are the database's
        failed = [r for r in records if r.error or r.infra_error]
        played = [r for r in records if not r.error and not r.infra_error]
        # the kill touched some episodes: lost (mid-episode, or a reset whose claim died with the replica) or played
        # again elsewhere (a reset refused before its claim)
        touched = failed + [r for r in played if r.attempts > 1]
        assert touched and played, [(r.error or r.infra_error, r.attempts) for r in records]
        for record in failed:  # one clear line, and no score
            message = record.error or record.infra_error["message"]
            assert "\n" not in message and len(message) <= 400 and record.infra_error is not None, record
            assert record.score is None
        assert all(r.sealed and r.score is None for r in played)
        store = ResultStore(postgres.url).open(migrate=False)
        try:
            attempts = store.attempts(run["run_id"])
        finally:
            store.close()
        by_instance = {a.instance_id: a for a in attempts}
        assert len(by_instance) == len(attempts)  # one attempt per instance, whatever happened
        for record in played:  # every attempt the client played was graded in the database
            attempt = by_instance[record.instance_id]
            assert attempt.status == "graded" and attempt.score >= 0.9
        graded = {a.instance_id for a in attempts if a.status == "graded"}
        assert graded >= {r.instance_id for r in played} and len(graded) <= len(played) + len(failed)
        # the health check took the dead replica out: its HTTP episode's /step gets a clear 421 from the survivor,
        # and new episodes all go to r1
        time.sleep(4 * cluster.check_s)
        with httpx.Client(base_url=cluster.url, timeout=60) as http:
            lost = http.post("/step", json={"episode_id": orphan, "action": CODE})
            assert lost.status_code == 421 and "replica 'r2'" in lost.json()["detail"], lost.text
            for _ in range(6):
                http.cookies.clear()
                reset = http.post("/reset", json={"task_id": "dead-neurons"})
                assert reset.status_code == 200 and reset.json()["episode_id"].startswith("r1."), reset.text
