"""Length-prefixed frames between the server and a sandbox worker (or the zygote).

A frame is a 12-byte header (JSON length, attachment length, sequence number, all big-endian u32), a
UTF-8 JSON object, and an optional binary attachment (the model's safetensors bytes). Every read is
bounded: a peer that announces more than ``max_json`` / ``max_blob`` bytes is a protocol error, so a
hostile worker cannot make the server allocate without limit.

Why the sequence number: the server numbers its requests and a reply carries the number of the request
it answers. ``send_frame`` without an explicit ``seq`` echoes the number last received on that socket,
so the worker loop answers correctly without knowing about it. A compromised worker that writes an
extra frame cannot shift the session's replies by one: the stale frame carries an old number, and the
server treats it as a lost worker.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from typing import Any

HEADER = struct.Struct(">III")
# The largest reply a worker sends (JSON bytes): the worker turns a larger result into an error message,
# and the server refuses a larger frame. One constant, so the two sides cannot drift apart.
MAX_REPLY = 1024 * 1024


class FrameError(Exception):
    """The peer closed the connection or broke the framing."""


class MalformedFrame(FrameError):
    """The peer sent bytes that are not a frame (too large, not JSON, not an object)."""


#: The sequence number last received on each socket (by fd): what an answer without ``seq`` echoes.
_last_received: dict[int, int] = {}


def send_frame(
    sock: socket.socket, message: dict[str, Any], blob: bytes = b"", seq: int | None = None, fd: int | None = None
) -> None:
    """One frame; ``fd`` (a sealed model file) rides on its first bytes as SCM_RIGHTS. The attachment is sent on
    its own, not joined to the header: joining copies it."""
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if seq is None:
        seq = _last_received.get(sock.fileno(), 0)
    head = HEADER.pack(len(data), len(blob), seq) + data
    sent = socket.send_fds(sock, [head], [fd]) if fd is not None else 0
    sock.sendall(head[sent:])
    if blob:
        sock.sendall(blob)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes; with a ``deadline`` (``time.monotonic()``) each wait is only what is left of it, so a peer that
    sends one byte just inside every timeout still runs out (``TimeoutError``): a socket's timeout counts per call."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the frame did not arrive before its deadline")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise FrameError("connection closed")
        got += k
    return bytes(buf)


def recv_frame(
    sock: socket.socket, max_json: int, max_blob: int = 0, deadline: float | None = None
) -> tuple[dict[str, Any], bytes]:
    """One frame's message and attachment; its sequence number is remembered for the answer."""
    message, blob, seq = recv_numbered(sock, max_json, max_blob, deadline=deadline)
    _last_received[sock.fileno()] = seq
    return message, blob


def recv_frame_fd(sock: socket.socket, max_json: int, max_blob: int = 0) -> tuple[dict[str, Any], bytes, int | None]:
    """``recv_frame`` for the worker: also the descriptor that may ride on the frame's first bytes (the caller
    owns it). Only workers read descriptors; the server reads with ``recv_numbered``, so the kernel drops any a
    worker sends."""
    first, fds, flags, _ = socket.recv_fds(sock, HEADER.size, 1)
    if flags & socket.MSG_CTRUNC or len(fds) > 1:
        for fd in fds:
            os.close(fd)
        raise MalformedFrame("a frame carried more than one descriptor")
    if not first:
        raise FrameError("connection closed")
    try:
        message, blob, seq = recv_numbered(sock, max_json, max_blob, first)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    _last_received[sock.fileno()] = seq
    return message, blob, fds[0] if fds else None


def recv_numbered(
    sock: socket.socket, max_json: int, max_blob: int = 0, first: bytes = b"", deadline: float | None = None
) -> tuple[dict[str, Any], bytes, int]:
    """One frame: its message, its attachment and its sequence number (``first``: header bytes already read). The
    server reads every worker reply with a ``deadline``: the whole frame must arrive by then."""
    n_json, n_blob, seq = HEADER.unpack(first + _recv_exact(sock, HEADER.size - len(first), deadline))
    if n_json > max_json or n_blob > max_blob:
        raise MalformedFrame(f"frame too large ({n_json} + {n_blob} bytes)")
    try:
        message = json.loads(_recv_exact(sock, n_json, deadline))
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser allows
        raise MalformedFrame(f"malformed frame: {type(exc).__name__}") from None
    if not isinstance(message, dict):
        raise MalformedFrame("malformed frame: not an object")
    return message, _recv_exact(sock, n_blob, deadline) if n_blob else b"", seq
