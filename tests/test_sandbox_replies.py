"""The server trusts no worker: forged reply frames end in a fresh worker, never a 5xx or a session out of step.

Why: a worker runs hostile code, so a snippet that escaped layers 1-2 owns the worker's end of the socket.
Each test uses the test-only ``unrestricted`` hook (plain Python in the hardened worker) to make the
worker's own reply path lie (by patching the worker loop's functions in its memory), then checks that
the next step reports a lost worker with ``namespace_reset`` and that the step after it is answered
correctly by a fresh worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers import cached_instance
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings

PATCH_RUN = """
from mechsandbox.server.sandbox.guest import runtime
runtime.Runtime.run = lambda self, source, soft_timeout=None: {reply}
result = 'patched'
"""

PATCH_SEND = """
from mechsandbox.server.sandbox import frames
from mechsandbox.server.sandbox.guest import worker
real = frames.send_frame
calls = []
def forged(sock, message, blob=b"", seq=None):
    calls.append(1)
    if len(calls) == 1:  # this unrestricted request's own answer
        return real(sock, message, blob, seq)
    {body}
worker.send_frame = forged
result = 'patched'
"""

FORGERIES = {
    "seconds-not-a-number": PATCH_RUN.format(
        reply="{'stdout': 'x', 'error': None, 'output_truncated': False, 'seconds': 'soon'}"
    ),
    "stdout-not-a-string": PATCH_RUN.format(
        reply="{'stdout': ['x'], 'error': None, 'output_truncated': False, 'seconds': 0.1}"
    ),
    "error-not-a-string": PATCH_RUN.format(
        reply="{'stdout': '', 'error': {'a': 1}, 'output_truncated': False, 'seconds': 0.1}"
    ),
    "unknown-keys": PATCH_RUN.format(
        reply="{'stdout': '', 'error': None, 'output_truncated': False, 'seconds': 0.1, 'namespace_reset': 1}"
    ),
    "oversize-stdout": PATCH_RUN.format(
        reply="{'stdout': 'A' * 1_000_000, 'error': None, 'output_truncated': False, 'seconds': 0.1}"
    ),
    "not-json": PATCH_SEND.format(body="sock.sendall(bytes([0, 0, 0, 4]) + bytes(8) + b'nope')"),
    "too-deep-json": PATCH_SEND.format(
        body="data = b'[' * 200000 + b']' * 200000\n"
        "    seq = frames._last_received[sock.fileno()]\n"
        "    sock.sendall(len(data).to_bytes(4, 'big') + bytes(4) + seq.to_bytes(4, 'big') + data)"
    ),
    "frame-too-large": PATCH_SEND.format(body="sock.sendall(bytes([0, 255, 255, 255]) + bytes(8))"),
    "wrong-sequence": PATCH_SEND.format(body="real(sock, message, blob, seq=999)"),
    "one-frame-too-many": PATCH_SEND.format(body="real(sock, message, blob)\n    real(sock, message, blob)"),
}


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    with SandboxPool(SandboxSettings(pool_size=2, wall_seconds=10.0, test_unrestricted=True)) as p:
        yield p


@pytest.fixture(scope="module")
def session(pool: SandboxPool) -> Iterator[Any]:
    s = pool.open_session(ModelPayload.from_instance(cached_instance("copy-head", 0, "easy")))
    yield s
    s.close()


@pytest.mark.parametrize("kind", list(FORGERIES))
def test_forged_reply_loses_the_worker_and_the_next_step_is_right(session: Any, kind: str) -> None:
    assert session.run("x = 41").error is None
    before = session.pid
    assert session.unrestricted(FORGERIES[kind]).get("result") == "patched"
    lost = session.run("print(x + 1)")
    if kind == "one-frame-too-many":  # the first copy is a valid answer; the stray one is caught next time
        assert lost.stdout == "42\n" and lost.error is None
        lost = session.run("print(x + 1)")
    assert lost.namespace_reset, lost
    assert "invalid reply" in (lost.error or ""), lost.error
    assert len(lost.stdout) <= session.pool.settings.output_cap
    fresh = session.run("print(2 + 3)")
    assert (fresh.stdout, fresh.error) == ("5\n", None)
    assert session.pid != before
    assert session.run("print(x)").error is not None  # a fresh namespace: x is gone


def test_honest_replies_still_pass(session: Any) -> None:
    result = session.run("print('a' * 100)\nanswer = [1, 2]")
    assert (result.stdout, result.error, result.namespace_reset) == ("a" * 100 + "\n", None, False)
    assert session.solution_from("answer") == ([1, 2], None)
    assert session.solution_from("missing")[1]
