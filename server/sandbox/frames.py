"""Length-prefixed frames between the server and a sandbox worker (or the zygote).

A frame is an 8-byte header (JSON length, attachment length, both big-endian u32), a UTF-8 JSON
object, and an optional binary attachment (the model's safetensors bytes). Every read is bounded:
a peer that announces more than ``max_json`` / ``max_blob`` bytes is a protocol error, so a
hostile worker cannot make the server allocate without limit.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">II")
# The largest reply a worker sends (JSON bytes): the worker turns a larger result into an error message,
# and the server refuses a larger frame. One constant, so the two sides cannot drift apart.
MAX_REPLY = 1024 * 1024


class FrameError(Exception):
    """The peer closed the connection or broke the framing."""


def send_frame(sock: socket.socket, message: dict[str, Any], blob: bytes = b"") -> None:
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    sock.sendall(HEADER.pack(len(data), len(blob)) + data + blob)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise FrameError("connection closed")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket, max_json: int, max_blob: int = 0) -> tuple[dict[str, Any], bytes]:
    n_json, n_blob = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if n_json > max_json or n_blob > max_blob:
        raise FrameError(f"frame too large ({n_json} + {n_blob} bytes)")
    try:
        message = json.loads(_recv_exact(sock, n_json))
    except ValueError as exc:
        raise FrameError(f"malformed frame: {exc}") from None
    if not isinstance(message, dict):
        raise FrameError("malformed frame: not an object")
    return message, _recv_exact(sock, n_blob) if n_blob else b""
