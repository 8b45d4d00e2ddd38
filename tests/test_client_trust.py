"""Trust between clients (issue 54), each class over a real server with a concrete attack of it:

- an MCP session belongs to the client that opened it: another token's ``tools/call`` and ``openenv/session/close``
  on it are answered as for an id that never existed (a red team ran, read, submitted and closed another token's
  session);
- a guessable test salt refuses to start unless declared public, and runs under a public salt are unranked (an
  8-character salt fell to a dictionary from its public fingerprint, then offline truths scored 0.99);
- ``X-Forwarded-For`` counts only from ``MECHSANDBOX_TRUSTED_PROXY`` (uvicorn honoured it from loopback);
- a server without tokens refuses cross-site POSTs and WebSockets (``Origin``);
- the run viewer reads only regular files inside a run folder, never through a link (it served a 0600 file).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mechsandbox.evaluation.report import summarise
from mechsandbox.server.app import create_app, proxy_options
from mechsandbox.server.runs import PUBLISHED_SALTS, Runs, WeakSalt, salt_bits
from mechsandbox.server.service import Service
from mechsandbox.settings import ServerSettings
from server_harness import free_port, running_server
from starlette.testclient import TestClient
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

TASK = {"task_id": "dead-neurons", "seed": 5}
ELSEWHERE = "https://attacker.example"
ALLOWED = "https://playground.example.org"


def rpc(http: httpx.Client, method: str, **params: Any) -> dict[str, Any]:
    response = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    assert response.status_code == 200, response.text
    return response.json()


def tool(http: httpx.Client, session_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return rpc(http, "tools/call", name=name, session_id=session_id, arguments=arguments)


# --- an MCP session is its opener's --------------------------------------------------------------


@pytest.fixture(scope="module")
def token_server(tmp_path_factory) -> Iterator[Any]:
    env = {"MECHSANDBOX_API_TOKENS": "tok-a,tok-b", "MECHSANDBOX_SESSION_CAP": "4", "MECHSANDBOX_CLIENT_SHARE": "0.5"}
    with running_server(tmp_path_factory.mktemp("trust-tokens"), **env) as server:
        yield server


def as_token(server: Any, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {token}"})


def test_another_token_cannot_use_or_close_an_mcp_session(token_server) -> None:
    with as_token(token_server, "tok-a") as a, as_token(token_server, "tok-b") as b:
        sid = rpc(a, "openenv/session/create")["result"]["session_id"]
        assert not tool(a, sid, "start_episode", **TASK)["result"]["isError"]
        assert not tool(a, sid, "run_python", code="secret = 41")["result"]["isError"]
        # what an id that never existed gets (same first 12 characters, so the messages can be compared whole)
        never = tool(b, sid[:12] + "-never-made", "run_python", code="print(1)")["error"]
        assert never["code"] == -32602 and "\n" not in never["message"]
        attacks = [
            tool(b, sid, "run_python", code="print(secret)"),
            tool(b, sid, "describe_task"),
            tool(b, sid, "submit_answer", answer=[0]),
            rpc(b, "openenv/session/close", session_id=sid),
        ]
        for reply in attacks:
            assert "result" not in reply and reply["error"] == never, reply
        # the opener's session is untouched: its namespace, its step count (b's calls were not steps), still open
        ran = tool(a, sid, "run_python", code="print(secret + 1)")["result"]
        assert ran["content"][0]["text"].startswith("42") and ran["structuredContent"]["step"] == 2, ran
        assert not ran["structuredContent"]["done"]
        assert "result" in rpc(a, "openenv/session/close", session_id=sid)


def test_another_token_cannot_reach_an_mcp_session_over_websockets(token_server) -> None:
    """OpenEnv's WebSockets name sessions too: ``/ws?session_id=`` attaches to one (it ran code in another token's
    namespace), and an ``openenv/session/close`` over ``WS /mcp`` or in a ``/ws`` "mcp" frame closed another's."""
    ws_url = token_server.url.replace("http", "ws")
    b_auth = {"Authorization": "Bearer tok-b"}
    with as_token(token_server, "tok-a") as a:
        sid = rpc(a, "openenv/session/create")["result"]["session_id"]
        assert not tool(a, sid, "start_episode", **TASK)["result"]["isError"]
        assert not tool(a, sid, "run_python", code="secret = 41")["result"]["isError"]
        for attached in (sid, sid[:12] + "-never-made"):  # refused alike, whether the id exists or not
            with pytest.raises(InvalidStatus) as refused:
                connect(f"{ws_url}/ws?session_id={attached}", additional_headers=b_auth, open_timeout=30)
            assert refused.value.response.status_code == 403
        close = {"jsonrpc": "2.0", "id": 7, "method": "openenv/session/close"}
        answers = []
        for target in (sid, sid[:12] + "-never-made"):
            with connect(f"{ws_url}/mcp", additional_headers=b_auth, open_timeout=30) as ws:
                ws.send(json.dumps({**close, "params": {"session_id": target}}))
                answers.append(json.loads(ws.recv(timeout=60)))
            with connect(f"{ws_url}/ws", additional_headers=b_auth, open_timeout=30) as ws:
                ws.send(json.dumps({"type": "mcp", "data": {**close, "params": {"session_id": target}}}))
                answers.append(json.loads(ws.recv(timeout=60)))
        replies = [answer["data"] if answer.get("type") == "mcp" else answer for answer in answers]
        assert all(reply.get("result") is None and reply["error"]["code"] == -32602 for reply in replies), answers
        assert answers[0] == answers[2] and answers[1] == answers[3], answers  # the same whether the id exists
        ran = tool(a, sid, "run_python", code="print(secret + 1)")["result"]
        assert ran["content"][0]["text"].startswith("42") and ran["structuredContent"]["step"] == 2, ran
        assert "result" in rpc(a, "openenv/session/close", session_id=sid)


# --- the test salt ---------------------------------------------------------------------------------


def test_the_entropy_estimate() -> None:
    """Length x log2 of the alphabets used: what brute force over those character classes costs."""
    assert salt_bits("password") < 40  # 8 x log2(26)
    assert salt_bits("eval-tests") < 128 and salt_bits("Tr0ub4dor&3") < 128
    assert salt_bits("YFm2rYEPkWU1JNjus8zP8sOoe-24JNaxxfH-CgxMRPg") > 250  # secrets.token_urlsafe(32)
    assert salt_bits("86ef58fa07baf3f6374a8a26ecc5a7a0") > 128  # 32 hex digits: 128 bits of randomness
    assert salt_bits("") == 0 and salt_bits("aaaa") == pytest.approx(4 * 4.70, abs=0.01)


def test_a_guessable_salt_refuses_to_start_in_one_line(tmp_path) -> None:
    env = {**os.environ, "MECHSANDBOX_TEST_SALT": "password", "MECHSANDBOX_PORT": str(free_port()),
           "MECHSANDBOX_HOST": "127.0.0.1", "MECHSANDBOX_DATA_DIR": str(tmp_path)}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "mechsandbox.cli", "serve"], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("mechsandbox serve: MECHSANDBOX_TEST_SALT is guessable")
    assert "MECHSANDBOX_PUBLIC_SALT" in last
    assert "Traceback" not in done.stderr


def test_a_guessable_salt_refuses_in_process_unless_public(tmp_path) -> None:
    weak = Service(ServerSettings(test_salt="password", data_dir=str(tmp_path)))
    with pytest.raises(WeakSalt, match="guessable: about 38 bits"):
        weak.start()
    weak.stop()
    settings = ServerSettings(test_salt="password", public_salt=True, data_dir=str(tmp_path))
    assert Runs(settings, b"password", False).salt_is_public
    calibration = ServerSettings(test_salt=PUBLISHED_SALTS[0], data_dir=str(tmp_path))
    assert Runs(calibration, PUBLISHED_SALTS[0].encode(), False).salt_is_public  # published: public by design
    secret = "YFm2rYEPkWU1JNjus8zP8sOoe-24JNaxxfH-CgxMRPg"
    assert not Runs(ServerSettings(test_salt=secret), secret.encode(), False).salt_is_public


STRONG = "YFm2rYEPkWU1JNjus8zP8sOoe-24JNaxxfH-CgxMRPg"  # secrets.token_urlsafe(32)


@pytest.mark.parametrize(("salt", "public"), [("password", True), (STRONG, False)])
def test_runs_under_a_public_salt_are_listed_unranked(tmp_path, salt: str, public: bool) -> None:
    settings = ServerSettings(test_salt=salt, public_salt=public, data_dir=str(tmp_path), run_quota=0)
    with TestClient(create_app(Service(settings))) as client:
        made = client.post("/runs", json={"agent": "probe", "model": "none"})
        assert made.status_code == 200, made.text
        board = client.get("/leaderboard").json()
    entry = next(r for r in board["runs"] if r["run_id"] == made.json()["run_id"])
    assert entry["public_salt"] is public
    assert [g["public_salt"] for g in board["groups"]] == [public]
    if public:
        assert entry["rank"] is None and board["salt"] == "public (runs unranked)"
    else:
        assert board["salt"] == "fixed"


# --- forwarded headers --------------------------------------------------------------------------------


def test_uvicorn_reads_forwarded_headers_only_from_the_trusted_proxy() -> None:
    assert proxy_options(ServerSettings()) == {"proxy_headers": False}
    assert proxy_options(ServerSettings(trusted_proxy="10.1.0.0/16")) == {
        "proxy_headers": True, "forwarded_allow_ips": "10.1.0.0/16"}  # fmt: skip


# --- a server without tokens: Origin, forwarded addresses, the run viewer -----------------------------


@pytest.fixture(scope="module")
def open_server(tmp_path_factory) -> Iterator[tuple[Any, Path]]:
    runs = tmp_path_factory.mktemp("trust-runs")
    env = {"MECHSANDBOX_SESSION_CAP": "10", "MECHSANDBOX_CLIENT_SHARE": "0.1", "MECHSANDBOX_RUN_DIRS": str(runs),
           "MECHSANDBOX_ALLOWED_ORIGINS": ALLOWED}  # fmt: skip
    with running_server(tmp_path_factory.mktemp("trust-open"), **env) as server:
        yield server, runs


@pytest.mark.parametrize("path", ["/reset", "/step", "/runs", "/mcp"])
def test_a_cross_site_post_is_refused(open_server, path: str) -> None:
    """What a page on another site can send without a preflight: a text/plain POST."""
    server, _ = open_server
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create"} if path == "/mcp" else TASK)
    response = httpx.post(server.url + path, content=body, timeout=60,
                          headers={"content-type": "text/plain", "origin": ELSEWHERE})  # fmt: skip
    assert response.status_code == 403, response.text
    message = response.json()["error"]["message"] if path == "/mcp" else response.json()["detail"]
    assert message.startswith("cross-site request refused") and ELSEWHERE in message and "\n" not in message


def test_own_listed_and_absent_origins_pass(open_server) -> None:
    """The playground's own origin (what a browser sends on a same-origin fetch), an operator-listed one, and no
    Origin at all (curl, SDKs) are served."""
    server, _ = open_server
    for origin in (server.url, ALLOWED, None):
        headers = {"origin": origin} if origin else {}
        reset = httpx.post(f"{server.url}/reset", json=TASK, headers=headers, timeout=120)
        assert reset.status_code == 200, (origin, reset.text)
    assert httpx.get(f"{server.url}/health", headers={"origin": ELSEWHERE}, timeout=30).status_code == 200  # a read


def test_a_cross_site_websocket_is_refused(open_server) -> None:
    server, _ = open_server
    ws_url = server.url.replace("http", "ws") + "/ws"
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url, origin=ELSEWHERE, open_timeout=30)  # type: ignore[arg-type]
    assert refused.value.response.status_code == 403
    with connect(ws_url, origin=server.url, open_timeout=30) as ws:  # type: ignore[arg-type]
        ws.send(json.dumps({"type": "reset", "data": TASK}))
        assert json.loads(ws.recv(timeout=120))["type"] == "observation"


def test_a_forged_forwarded_for_from_loopback_does_not_change_the_quota(open_server) -> None:
    """Without MECHSANDBOX_TRUSTED_PROXY the header is the client's own claim: this loopback client stays itself
    (exempt), so it can neither take another address's quota nor spread itself over invented ones. Before, uvicorn
    took the header from loopback: the client became 203.0.113.5, one session of the cap of 10 at a 0.1 share."""
    server, _ = open_server
    forged = {"x-forwarded-for": "203.0.113.5"}
    made = []
    with httpx.Client(base_url=server.url, timeout=120, headers=forged) as http:
        try:
            for _ in range(2):
                reply = rpc(http, "openenv/session/create")
                assert "result" in reply, reply
                made.append(reply["result"]["session_id"])
        finally:
            for sid in made:
                rpc(http, "openenv/session/close", session_id=sid)


def write_run(folder: Path) -> None:
    """A run folder as `mechsandbox eval --out` leaves it (summary.json agrees with results.jsonl)."""
    rows = [{"task_id": "dead-neurons", "level": "easy", "score": 0.5, "steps": 3, "seed": 1}]
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "summary.json").write_text(json.dumps(summarise(rows, {"split": "train"})))


def test_the_run_viewer_never_reads_through_a_link(open_server, tmp_path) -> None:
    server, runs = open_server
    private = tmp_path / "private"
    private.mkdir()
    secret_svg = private / "secret.svg"
    secret_svg.write_text('<svg xmlns="http://www.w3.org/2000/svg"><text>PRIVATE-FIGURE-7731</text></svg>')
    secret_json = private / "secret.json"
    secret_json.write_text(json.dumps({"task_id": "PRIVATE-TRAJECTORY-7731", "steps": []}))
    for file in (secret_svg, secret_json):
        file.chmod(0o600)
    linked = runs / "linked-files"
    write_run(linked)
    (linked / "scores.svg").symlink_to(secret_svg)
    (linked / "trajectories").mkdir()
    (linked / "trajectories" / "0001.json").symlink_to(secret_json)
    write_run(tmp_path / "elsewhere")
    (runs / "linked-folder").symlink_to(tmp_path / "elsewhere")  # a whole run folder through a link
    write_run(runs / "linked-summary")
    (runs / "linked-summary" / "summary.json").unlink()
    (runs / "linked-summary" / "summary.json").symlink_to(secret_json)

    page = httpx.get(f"{server.url}/web/runs/dir/linked-files", timeout=120)
    assert page.status_code == 200, page.text  # the run itself is shown, figures drawn from its summary
    assert "PRIVATE-" not in page.text
    assert base64.b64encode(secret_svg.read_bytes()).decode() not in page.text
    for name in ("linked-folder", "linked-summary"):
        assert httpx.get(f"{server.url}/web/runs/dir/{name}", timeout=60).status_code == 404, name
    index = httpx.get(f"{server.url}/web/runs", timeout=60).text
    assert "linked-files" in index and "linked-folder" not in index and "linked-summary" not in index
