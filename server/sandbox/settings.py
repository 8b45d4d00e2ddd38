"""Sandbox settings: one dataclass, every field overridable by a ``MECHSANDBOX_*`` environment variable."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace

KNOWN_LAYERS = ("rlimits", "uid", "landlock", "seccomp")


def _total_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class SandboxSettings:
    pool_size: int = 4  # warm, model-less workers kept ready
    wall_seconds: float = 10.0  # per snippet; the worker's process group is killed past it
    worker_memory_mb: int = 1024  # address space per worker above the zygote's measured baseline
    memory_budget_mb: int = 0  # all workers' private memory together; 0 = RAM minus 4 GiB
    cpu_seconds: int = 900  # RLIMIT_CPU per worker (a backstop; the wall limit acts first)
    uid_drop: str = "auto"  # auto | force | off
    landlock: bool = True
    seccomp: bool = True
    rlimits: bool = True
    require: tuple[str, ...] = ()  # layers that must be active, else the pool refuses to start
    output_cap: int = 64 * 1024
    error_cap: int = 2048
    watchdog_interval: float = 0.5
    max_workers: int = 256
    test_unrestricted: bool = field(default=False, repr=False)  # test-only: allows the "unrestricted" op

    def budget_bytes(self) -> int:
        if self.memory_budget_mb > 0:
            return self.memory_budget_mb * 1024 * 1024
        return max(_total_ram() - 4 * 1024**3, 1024**3)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> SandboxSettings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            if f.name == "test_unrestricted":
                continue
            raw = env.get(f"MECHSANDBOX_{f.name.upper()}")
            if raw is None:
                continue
            values[f.name] = parse_setting(f"MECHSANDBOX_{f.name.upper()}", raw, f.type)
        settings = replace(cls(), **values, **overrides)
        unknown = set(settings.require) - set(KNOWN_LAYERS)
        if unknown:
            raise ValueError(f"MECHSANDBOX_REQUIRE names unknown layers {sorted(unknown)}; known: {list(KNOWN_LAYERS)}")
        if settings.uid_drop not in ("auto", "force", "off"):
            raise ValueError("MECHSANDBOX_UID_DROP must be auto, force or off")
        return settings


def parse_setting(key: str, raw: str, kind: object) -> object:
    """One environment value converted to a dataclass field's type (tuple, bool, float, int or str)."""
    kind = str(kind)
    try:
        if "tuple" in kind:
            return tuple(p.strip() for p in raw.split(",") if p.strip())
        if "bool" in kind:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes", "on")
        if "float" in kind:
            return float(raw)
        if "int" in kind:
            return int(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a valid {kind}") from None
    return raw
