"""Landlock through raw syscalls (ctypes): read-only library paths, no network, scoped signals.

Why raw syscalls: the PyPI binding covers only the file-system half; TCP and scope restrictions
(ABI 4 and 6) need the full ruleset attribute. Landlock works unprivileged (it needs
``no_new_privs``), and it is what stops an escaped worker from reading ``/proc/<server>/environ``,
``/etc`` or a canary file, and from creating files in ``/tmp`` or ``/dev/shm`` (RLIMIT_FSIZE=0
stops writes but not file creation). The syscall numbers 444-446 are the same on every
architecture that has Landlock.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterable

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_TRUNCATE, FS_IOCTL_DEV = 1 << 14, 1 << 15
FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1, 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi_version() -> int:
    """The kernel's Landlock ABI (0 when unavailable)."""
    v = _libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(int(v), 0)


def _handled_fs(abi: int) -> int:
    bits = (1 << 13) - 1  # EXECUTE .. MAKE_SYM (ABI 1)
    if abi >= 2:
        bits |= 1 << 13  # REFER
    if abi >= 3:
        bits |= FS_TRUNCATE
    if abi >= 5:
        bits |= FS_IOCTL_DEV
    return bits


def restrict(read_paths: Iterable[str]) -> int:
    """Restrict this process (and later threads) to reading ``read_paths``; return the ABI used.

    Raises OSError when the kernel refuses. Paths that do not exist are skipped.
    """
    abi = abi_version()
    if abi < 1:
        raise OSError("Landlock is not available on this kernel")
    handled_fs = _handled_fs(abi)
    attr = struct.pack("=Q", handled_fs)
    if abi >= 4:
        attr += struct.pack("=Q", NET_BIND_TCP | NET_CONNECT_TCP)
    if abi >= 6:
        attr += struct.pack("=Q", SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _libc.syscall(SYS_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path in read_paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                is_dir = os.path.isdir(path)
                access = FS_EXECUTE | FS_READ_FILE | (FS_READ_DIR if is_dir else 0)
                rule = ctypes.create_string_buffer(
                    struct.pack("=Qi", access & (handled_fs if is_dir else FILE_ONLY), fd), 12
                )
                if (
                    _libc.syscall(
                        SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(RULE_PATH_BENEATH), rule, ctypes.c_uint32(0)
                    )
                    < 0
                ):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
            finally:
                os.close(fd)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if _libc.syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi
