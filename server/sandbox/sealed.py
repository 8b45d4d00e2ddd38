"""A model's safetensors bytes in a sealed memory file, handed to workers as a file descriptor.

Why: a reset loads the public model into a warm worker. Sent through the worker's socket, a transformer's bytes
(37 MB for head-roles hard) cost about 100 ms on this 2-core machine even idle, most of it copies and page faults
on both sides, and several times that under load. A sealed memfd is written once when the instance is generated;
a reset passes its descriptor (SCM_RIGHTS) and the worker maps it copy-on-write: nothing is copied until a snippet
writes a weight, and then only that page, in that worker.

Why it is safe to share: the server adds every seal (no write, no resize, no further seal changes) before any
worker sees the descriptor, so a worker, escaped or not, can read the public weights it was sent anyway and
nothing else: it cannot write the file through ``write``, ``pwrite``, ``ftruncate``, ``fallocate`` or a shared
writable mapping (tests/test_sandbox_sealed.py tries each from an unrestricted worker). Its private mapping's
writes stay in its own pages, so sessions on the same instance never see each other's edits.

``memfd_create`` is Linux only; where it fails the payload keeps plain bytes and the socket carries them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import json
import mmap
import os
import resource
import struct
import weakref
from typing import Any

import torch

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
# Every cached or prefetched instance holds one descriptor; the server keeps this many free for its sockets, workers
# and files (a host's soft limit may be 1024): past it, payloads keep plain bytes.
FD_RESERVE = 256
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL

# safetensors' dtype names (the format's specification) -> torch
DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip


class SealedBlob:
    """A read-only memory file holding one payload's bytes; the descriptor closes with the object."""

    def __init__(self, fd: int, size: int):
        self.fd, self.size = fd, size
        self._closer = weakref.finalize(self, os.close, fd)

    @classmethod
    def create(cls, data: bytes, name: str = "mechsandbox-model") -> SealedBlob | None:
        """The bytes in a sealed memfd, or None where memory files are not available (then send bytes)."""
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except (AttributeError, OSError):
            return None
        if fd >= resource.getrlimit(resource.RLIMIT_NOFILE)[0] - FD_RESERVE:
            os.close(fd)  # descriptors come lowest first, so this one says the table is nearly full: keep bytes
            return None
        try:
            view = memoryview(data)
            written = 0
            while written < len(view):
                written += os.write(fd, view[written:])
            os.utime(fd, (0, 0))  # a worker's fstat must not date the instance's generation (ctime still does)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            os.fchmod(fd, 0o400)  # no other uid opens it at all (every write path is sealed shut anyway)
            with contextlib.suppress(OSError):  # the server's own reads (``read``) leave the access time alone
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NOATIME)
        except OSError:
            os.close(fd)
            return None
        return cls(fd, len(data))

    def reader(self) -> int | None:
        """A new read-only open of the file for one worker (the caller closes it), or None without ``/proc``.

        Not ``fd`` itself: a descriptor passed over a socket shares its open file description, whose offset, status
        flags and locks the receiver can change (a red team, 2026-12-04: ``lseek``, ``F_SETFL``, ``flock`` from an
        escaped worker showed up on the server's descriptor), so every holder would share one mutable channel.
        Opened with O_NOATIME: the file lives on the kernel's own shm mount, which updates the access time on every
        mapping and read, so a worker's ``fstat`` would otherwise show when other sessions loaded the same instance
        (a red team, 2026-12-05). Locks on the file, which every holder shares, are refused by the worker's seccomp."""
        path = f"/proc/self/fd/{self.fd}"
        for flags in (os.O_RDONLY | os.O_CLOEXEC | os.O_NOATIME, os.O_RDONLY | os.O_CLOEXEC):
            try:
                return os.open(path, flags)
            except PermissionError:
                continue  # O_NOATIME wants the file's owner (a server whose uid changed since): open without it
            except OSError:
                return None
        return None

    def read(self) -> bytes:
        """The bytes (a copy), for the callers that want them as such (warm-ups, tests, benchmarks)."""
        return os.pread(self.fd, self.size, 0)

    def close(self) -> None:
        self._closer()


def map_tensors(fd: int) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors memory file, over a fresh copy-on-write mapping of it.

    Each call maps the file again, so tensors from two calls share no writable page: ``reset_model`` gets the
    weights as loaded whatever a snippet wrote into the previous copy. The layout is safetensors' own: an 8-byte
    little-endian header length, a JSON header of ``{name: {dtype, shape, data_offsets}}``, then the data."""
    size = os.fstat(fd).st_size
    if size < 8:
        raise ValueError("the model file is shorter than a safetensors header")
    mapping = _private_mapping(fd, size)
    (n_header,) = struct.unpack_from("<Q", mapping, 0)  # type: ignore[arg-type]
    if n_header > size - 8:
        raise ValueError("the safetensors header runs past the end of the model file")
    header: dict[str, Any] = json.loads(bytes(mapping[8 : 8 + n_header]))
    start = 8 + n_header
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = DTYPES[entry["dtype"]], [int(d) for d in entry["shape"]]
        begin, end = (start + int(x) for x in entry["data_offsets"])
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = (end - begin) // itemsize
        if not start <= begin <= end <= size or end - begin != _numel(shape) * itemsize:
            raise ValueError(f"tensor {name!r} does not fit its header entry")
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        elif begin % itemsize:  # unaligned: torch reads it as a copy
            tensors[name] = torch.frombuffer(bytearray(mapping[begin:end]), dtype=dtype).reshape(shape)
        else:
            tensors[name] = torch.frombuffer(mapping, dtype=dtype, count=count, offset=begin).reshape(shape)
    return tensors  # each tensor holds a reference to ``mapping``: it is unmapped when the last one goes


def _private_mapping(fd: int, size: int) -> ctypes.Array:
    """``size`` bytes of ``fd`` mapped copy-on-write, as a ctypes array that unmaps itself when collected.

    Not ``mmap.mmap``: before Python 3.13 it keeps a duplicate of the descriptor open for the mapping's life, and a
    worker may open 64 files, so a session that keeps a few dozen models from ``reset_model`` would run out."""
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        err = ctypes.get_errno()
        raise OSError(err, f"mapping the model file failed: {os.strerror(err)}")
    array = (ctypes.c_char * size).from_address(address)
    unmap = weakref.finalize(array, _libc.munmap, ctypes.c_void_p(address), ctypes.c_size_t(size))
    unmap.atexit = False  # at exit tensors may still point into it; the process's end unmaps everything
    return array


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
