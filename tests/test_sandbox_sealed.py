"""The sealed model file a reset hands a worker (server/sandbox/sealed.py): read-only for everyone, private per session.

A payload's safetensors bytes live in a sealed memfd; every worker loading that instance gets the same descriptor.
So the class of attack to close is "a worker changes the shared file", by any write path, with or without the
language layers: tried here in the server process itself and from unrestricted code in a hardened worker (as if
layers 1-2 had fallen). And a snippet's weight edits, which land in its own copy-on-write pages, must stay in its
session.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import resource
import socket

import pytest
import safetensors.torch
import torch
from helpers import cached_instance, shared_pool
from mechsandbox.arch import ARCHITECTURES, build, build_with
from mechsandbox.server.sandbox import ModelPayload, SandboxPool, SandboxSettings
from mechsandbox.server.sandbox.frames import MalformedFrame, recv_frame_fd, send_frame
from mechsandbox.server.sandbox.sealed import FD_RESERVE, SEALS, SealedBlob, map_tensors

# Every way to change a file through a descriptor, as plain Python: (name, code taking fd).
WRITES = {
    "write": lambda fd: os.write(fd, b"x"),
    "pwrite": lambda fd: os.pwrite(fd, b"x", 64),
    "ftruncate": lambda fd: os.ftruncate(fd, 1),
    "grow": lambda fd: os.posix_fallocate(fd, 0, os.fstat(fd).st_size + 4096),
    "shared mapping": lambda fd: mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE),
    "unseal": lambda fd: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0),
}


def _escape_pool() -> SandboxPool:
    """A pool whose sessions also take unrestricted Python (as if layers 1-2 had fallen; tests only)."""
    return SandboxPool(SandboxSettings(pool_size=1, wall_seconds=20.0, test_unrestricted=True))


def _escaped(pool: SandboxPool, payload: ModelPayload, code: str) -> dict:
    """``code`` as plain Python in a fresh session on ``payload``; its reply (``result`` is the code's variable)."""
    session = pool.open_session(payload)
    try:
        return session.unrestricted(code)
    finally:
        session.close()


def _payload(task: str = "copy-head") -> ModelPayload:
    payload = ModelPayload.from_instance(cached_instance(task, 0, "easy"))
    assert payload.fd is not None, "this machine has memfd_create: the payload must be sealed"
    return payload


def test_every_write_path_is_refused_in_the_server_process() -> None:
    blob = SealedBlob.create(b"0123456789" * 1000)
    assert blob is not None
    assert fcntl.fcntl(blob.fd, fcntl.F_GET_SEALS) == SEALS
    for name, attempt in WRITES.items():
        with pytest.raises(OSError) as caught:
            attempt(blob.fd)
        assert caught.value.errno == errno.EPERM, name
    assert blob.read() == b"0123456789" * 1000


def test_mapped_tensors_equal_the_safetensors_library() -> None:
    """The worker's own reader of the format against safetensors' (every tensor, bit for bit), on a transformer."""
    payload = _payload()
    expected = safetensors.torch.load(payload.blob)
    got = map_tensors(payload.fd)
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def test_mapped_tensors_are_private_copies() -> None:
    payload = _payload()
    first, second = map_tensors(payload.fd), map_tensors(payload.fd)
    name = next(k for k, v in first.items() if v.is_floating_point() and v.numel())
    before = second[name].clone()
    first[name].add_(1.0)  # a write into one mapping's pages
    assert torch.equal(second[name], before)
    assert torch.equal(map_tensors(payload.fd)[name], before)


ESCAPED = """
import os, mmap, fcntl, stat
changed = []
for fd in range(3, 1024):
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            continue
    except OSError:
        continue
    size = os.fstat(fd).st_size
    attempts = {
        "write": lambda: os.write(fd, b"x"),
        "pwrite": lambda: os.pwrite(fd, b"x", 64),
        "ftruncate": lambda: os.ftruncate(fd, 1),
        "grow": lambda: os.posix_fallocate(fd, 0, size + 4096),
        "shared mapping": lambda: mmap.mmap(fd, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE),
        "unseal": lambda: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0),
    }
    for name, attempt in attempts.items():
        try:
            attempt()
            changed.append((fd, name))
        except (OSError, ValueError):
            pass
    try:
        private = mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        private[64:72] = b"escaped!"  # allowed: its own copy-on-write page
    except (OSError, ValueError):
        pass
result = changed
"""


def test_an_escaped_worker_cannot_change_the_shared_model() -> None:
    """Unrestricted Python in a hardened worker tries every write path on every regular file it holds (the sealed
    model among them); nothing lands, and the next session on the same payload sees the weights as sent."""
    payload = _payload()
    pristine = payload.blob
    with _escape_pool() as pool:
        reply = _escaped(pool, payload, ESCAPED)
        assert reply["error"] is None, reply
        assert reply["result"] == [], reply["result"]
        assert payload.blob == pristine
        victim = pool.open_session(payload)
        try:
            out = victim.run("print(float(sum(p.double().abs().sum() for p in model.parameters())))")
        finally:
            victim.close()
    expected = float(sum(t.double().abs().sum() for k, t in safetensors.torch.load(pristine).items()
                         if k.startswith("model.")))  # fmt: skip
    assert out.error is None and float(out.stdout) == expected, (out, expected)


EDIT = """
with torch.no_grad():
    model.W_E.mul_(0.0).add_(3.0)
print(float(model.W_E.abs().sum()) == 3.0 * model.W_E.numel())
"""


def test_weight_edits_stay_in_their_session() -> None:
    payload = _payload()
    pool = shared_pool()
    a, b = pool.open_session(payload), pool.open_session(payload)
    try:
        original = b.run("print(float(model.W_E.abs().sum()))").stdout
        edited = a.run(EDIT)
        assert edited.error is None and edited.stdout == "True\n", edited
        assert original != "3.0\n"
        assert b.run("print(float(model.W_E.abs().sum()))").stdout == original  # b's weights as sent
        assert a.run("reset_model()\nprint(float(model.W_E.abs().sum()))").stdout == original
        c = pool.open_session(payload)
        try:
            assert c.run("print(float(model.W_E.abs().sum()))").stdout == original
        finally:
            c.close()
    finally:
        a.close()
        b.close()


def test_plain_and_sealed_payloads_load_the_same_model() -> None:
    inst = cached_instance("head-roles", 0, "easy")
    code = "print([float(p.double().sum()) for p in model.parameters()], [float(v.double().sum()) for v in [tokens]])"
    outs = []
    for sealed in (True, False):
        payload = ModelPayload.from_instance(inst, sealed=sealed)
        assert (payload.fd is not None) is sealed
        session = shared_pool().open_session(payload)
        try:
            outs.append(session.run(code))
        finally:
            session.close()
    assert outs[0].error is None and outs[0].stdout == outs[1].stdout


def test_a_frame_with_two_descriptors_is_refused() -> None:
    """A worker takes at most one descriptor per frame (the model file); more is a protocol error, and the
    descriptors it received are closed, not leaked into the namespace's reach."""
    one, two = SealedBlob.create(b"a"), SealedBlob.create(b"b")
    assert one is not None and two is not None
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        socket.send_fds(left, [b"\x00" * 12], [one.fd, two.fd])
        open_before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(MalformedFrame):
            recv_frame_fd(right, 1024)
        assert len(os.listdir("/proc/self/fd")) <= open_before
        send_frame(left, {"op": "load"}, fd=one.fd)
        message, blob, fd = recv_frame_fd(right, 1024)
        assert message == {"op": "load"} and blob == b"" and fd is not None
        assert os.pread(fd, 1, 0) == b"a"
        os.close(fd)


MANY_RESETS = """
kept = []
for i in range(100):
    kept.append(model)
    reset_model()
print(len(kept), torch.equal(kept[0].W_E, model.W_E))
"""


def test_a_session_can_keep_many_models() -> None:
    """Each ``reset_model`` maps the model file again, and a worker may open 64 files: the mappings must hold no
    descriptor (Python's ``mmap`` before 3.13 keeps one open per mapping), so 100 live models still work."""
    session = shared_pool().open_session(_payload())
    try:
        result = session.run(MANY_RESETS)
    finally:
        session.close()
    assert result.error is None and result.stdout == "100 True\n", result


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_build_with_gives_the_model_build_and_load_give(name: str) -> None:
    """A worker builds its model on the meta device and assigns the mapped tensors (``arch.build_with``): every
    parameter and buffer (the causal mask included, which the weights do not carry) and the forward pass must be
    those of the plain build + load_state_dict."""
    arch = ARCHITECTURES[name]
    record = arch.tiny_record()
    gen = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=gen).to(v.dtype) for k, v in build(record).state_dict().items()}
    plain = build(record)
    plain.load_state_dict(state)
    assigned = build_with(record, {k: v.clone() for k, v in state.items()})
    named = dict(plain.named_buffers()) | dict(plain.named_parameters())
    for key, tensor in [*assigned.named_buffers(), *assigned.named_parameters()]:
        assert not tensor.is_meta and torch.equal(tensor, named[key]), key
    assert sorted(named) == sorted(dict(assigned.named_buffers()) | dict(assigned.named_parameters()))
    sample = arch.sample(record)
    assert torch.equal(plain.eval()(sample), assigned.eval()(sample))


def test_a_nearly_full_descriptor_table_keeps_plain_bytes() -> None:
    """Each sealed payload holds a descriptor; when the next one would come within ``FD_RESERVE`` of the soft limit
    (a host's may be 1024), the payload keeps bytes, so a large cache never starves the server's sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    probe = os.open("/dev/null", os.O_RDONLY)
    os.close(probe)
    resource.setrlimit(resource.RLIMIT_NOFILE, (probe + FD_RESERVE, hard))  # the next descriptor is past the line
    try:
        assert SealedBlob.create(b"x") is None
        payload = ModelPayload.from_instance(cached_instance("dead-neurons", 0, "easy"))
        assert payload.fd is None and isinstance(payload.data, bytes)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert SealedBlob.create(b"x") is not None


SHARED_STATE = """
import ctypes, os, fcntl, platform, struct
model_fds = [fd for fd in range(3, 64) if os.path.exists(f"/proc/self/fd/{fd}")
             and os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:mechsandbox-model")]
fd = model_fds[0]
os.lseek(fd, 12345, os.SEEK_SET)
fcntl.fcntl(fd, fcntl.F_SETFL, os.O_APPEND | os.O_NONBLOCK)
lock = struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def raw_setlk():  # the kernel reads cmd as 32 bits: a filter comparing all 64 would let 1 << 32 | F_SETLK through
    number = {"x86_64": 72, "aarch64": 25}[platform.machine()]  # SYS_fcntl
    command = ctypes.c_ulong(1 << 32 | fcntl.F_SETLK)
    if libc.syscall(number, ctypes.c_long(fd), command, ctypes.create_string_buffer(lock)) < 0:
        raise OSError(ctypes.get_errno(), "fcntl")
refused = []
for attempt in (lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB),
                lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB),
                lambda: fcntl.fcntl(fd, fcntl.F_GETLK, lock), lambda: fcntl.fcntl(fd, 37, lock),  # F_OFD_SETLK
                lambda: fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK), lambda: fcntl.fcntl(fd, fcntl.F_NOTIFY, 1),
                raw_setlk):
    try:
        attempt()
        refused.append("allowed")
    except OSError as exc:
        refused.append(exc.errno)
status = os.fstat(fd)
result = [len(model_fds), fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY, status.st_mtime,
          status.st_atime, refused]
"""


def test_a_worker_gets_a_read_only_descriptor_of_its_own() -> None:
    """A passed descriptor shares its open file description: had every worker got the server's, an escaped one could
    move the offset, set status flags or take a lock on what every holder shares (a red team, 2026-12-04). Each
    load opens the file anew, read-only. What every holder shares on the file itself is closed too (a red team,
    2026-12-05): locks, leases and change notifications are refused by the worker's seccomp (EPERM), and no load
    touches the access time (O_NOATIME), so a worker's fstat tells neither when the instance was generated nor when
    other sessions loaded it."""
    payload = _payload()
    flags, offset = fcntl.fcntl(payload.fd, fcntl.F_GETFL), os.lseek(payload.fd, 0, os.SEEK_CUR)
    with _escape_pool() as pool:
        for _ in range(2):  # the second session's fstat comes after the first one's load and mappings
            reply = _escaped(pool, payload, SHARED_STATE)
            assert reply["error"] is None and reply["result"] == [1, True, 0.0, 0.0, [errno.EPERM] * 7], reply
    status = os.fstat(payload.fd)
    assert status.st_atime == 0.0 and status.st_mode & 0o777 == 0o400
    assert os.lseek(payload.fd, 0, os.SEEK_CUR) == offset != 12345 and fcntl.fcntl(payload.fd, fcntl.F_GETFL) == flags
    other = os.open(f"/proc/self/fd/{payload.fd}", os.O_RDONLY)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no lock left behind by the worker
    finally:
        os.close(other)
