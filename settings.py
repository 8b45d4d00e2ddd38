"""Every deployment setting of MechSandbox, declared once, with its parsing, validation and docs.

Why: the server and the sandbox are configured only through ``MECHSANDBOX_*`` environment
variables. Each one used to be spelled out in several places (a dataclass field, an ad-hoc check in
``from_env``, a hand-written README row), and they drifted apart: types were guessed from the text
of an annotation, checks ran only on the environment path, and some knobs were never documented.
Here a setting is a single declaration from which everything else follows:

* its environment variable, ``MECHSANDBOX_<FIELD NAME>`` (one fallback name is allowed: ``PORT``);
* its type, from the field's annotation (``int``, ``float``, ``bool``, ``str`` or ``tuple[str, ...]``,
  the last written as a comma list);
* its default, range (``minimum``/``maximum``) or ``choices``, and a one-line ``doc``;
* validation in ``__post_init__``, so values from the environment, from ``from_env(**overrides)``
  and from direct construction (``SandboxSettings(pool_size=1)``) all pass the same checks and fail
  with one line that names the variable;
* the README table (``mechsandbox settings --markdown``; a test compares the two).

Adding a setting is one field in ``ServerSettings`` or ``SandboxSettings``::

    new_knob: int = setting(8, "what it does, in one line", minimum=1)

Nothing else: no parser, no check, no table row to write by hand (regenerate the README table).

This module imports only the standard library: the sandbox and light clients import it, and it
must never pull in torch or the task families.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Self, TypeVar

PREFIX = "MECHSANDBOX_"
KNOWN_LAYERS = ("rlimits", "uid", "landlock", "seccomp", "namespaces", "pids")
REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}")  # no '.': it ends the tag in an episode id
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's names
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_DECLARATION = "mechsandbox.setting"  # the key of a setting's declaration in its field's metadata
_KIND_WORDS = {int: "an integer", float: "a finite number", bool: "a boolean", str: "text", tuple: "a comma list"}


def env_name(field_name: str) -> str:
    """The environment variable of a settings field: ``session_cap`` -> ``MECHSANDBOX_SESSION_CAP``."""
    return PREFIX + field_name.upper()


@dataclass(frozen=True)
class Setting:
    """One declared setting: where it is read from, what it accepts and what it means."""

    name: str  # the dataclass field
    env: str  # the environment variable
    kind: type  # int, float, bool, str or tuple (a comma list of str)
    default: Any
    doc: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()  # for str: the value; for a list: every entry
    items: str = "entries"  # what the entries of a list are called in messages ("layers")
    fallback: str | None = None  # read when ``env`` is unset (``PORT`` for the port)

    def read(self, environ: Mapping[str, str]) -> object:
        """The checked value from ``environ`` (``env``, then ``fallback``), or None when neither is set."""
        for variable in (self.env, self.fallback):
            if variable and variable in environ:
                return self.check(self.parse(environ[variable], variable), variable)
        return None

    def parse(self, raw: str, variable: str | None = None) -> object:
        """An environment string converted to the setting's type; range and choices are ``check``'s job."""
        try:
            if self.kind is tuple:
                return tuple(part.strip() for part in raw.split(",") if part.strip())
            if self.kind is bool:
                if raw.strip().lower() in _TRUE:
                    return True
                if raw.strip().lower() in _FALSE:
                    return False
                raise ValueError(raw)
            return self.kind(raw)
        except ValueError:
            hint = " (true/false, 1/0, yes/no, on/off)" if self.kind is bool else ""
            raise ValueError(f"{variable or self.env}={raw!r} is not {_KIND_WORDS[self.kind]}{hint}") from None

    def check(self, value: object, variable: str | None = None) -> object:
        """``value`` if it is valid (ints widened to float, lists to tuples), else a ValueError naming ``variable``.

        The one place where settings are validated: ``from_env`` and ``__post_init__`` both call it.
        """
        name = variable or self.env
        value = self._typed(value, name)
        if self.kind in (int, float):
            number = typing.cast(float, value)
            low, high = self.minimum, self.maximum
            if (low is not None and number < low) or (high is not None and number > high):
                raise ValueError(f"{name}={self.show(value)} is out of range: must be {self.range_text()}")
        elif self.choices:
            entries = typing.cast(tuple[str, ...], value) if self.kind is tuple else (typing.cast(str, value),)
            unknown = [entry for entry in entries if entry not in self.choices]
            if unknown and self.kind is tuple:
                raise ValueError(f"{name}={self.show(value)} names unknown {self.items} {unknown}; "
                                 f"known: {', '.join(self.choices)}")  # fmt: skip
            if unknown:
                raise ValueError(f"{name}={self.show(value)} is not allowed: must be one of {', '.join(self.choices)}")
        return value

    def _typed(self, value: object, name: str) -> object:
        """The type check of ``check`` (bool is never taken for a number, nor a number for a bool)."""
        if self.kind is bool:
            ok = isinstance(value, bool)
        elif self.kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.kind is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            value = float(value) if ok else value  # type: ignore[arg-type]
        elif self.kind is tuple:
            ok = isinstance(value, tuple | list) and all(isinstance(entry, str) for entry in value)
            value = tuple(value) if ok else value  # type: ignore[arg-type]
        else:
            ok = isinstance(value, str)
        if not ok:
            raise ValueError(f"{name}={value!r} is not {_KIND_WORDS[self.kind]}")
        return value

    def show(self, value: object) -> str:
        """A value written as it would be in the environment."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, tuple):
            return ",".join(value)
        if isinstance(value, float):
            return str(int(value)) if value.is_integer() else repr(value)  # exact, without a trailing ".0"
        return str(value)

    def default_text(self) -> str:
        """The default as the tables show it: ``(empty)`` / ``(none)`` rather than nothing."""
        shown = self.show(self.default)
        return shown or ("(none)" if self.kind is tuple else "(empty)")

    def range_text(self) -> str:
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            return f"between {self.show(low)} and {self.show(high)}"
        return f">= {self.show(low)}" if low is not None else f"<= {self.show(high)}"

    def values_text(self) -> str:
        """What the setting accepts, in words for the table."""
        if self.choices:
            listed = ", ".join(f"`{choice}`" for choice in self.choices)
            return f"comma list of {listed}" if self.kind is tuple else listed
        words = {int: "integer", float: "number", bool: "true / false", str: "text", tuple: "comma list"}[self.kind]
        if self.kind in (int, float) and (self.minimum is not None or self.maximum is not None):
            return f"{words} {self.range_text()}"
        return words


def setting(
    default: object,
    doc: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] = (),
    items: str = "entries",
    fallback: str | None = None,
) -> Any:
    """A dataclass field that is a setting (typed ``Any`` so that ``port: int = setting(8000, ...)`` checks)."""
    declaration = {"doc": doc, "minimum": minimum, "maximum": maximum, "choices": choices, "items": items,
                   "fallback": fallback}  # fmt: skip
    return field(default=default, metadata={_DECLARATION: declaration})


_KINDS: dict[object, type] = {int: int, float: float, bool: bool, str: str, tuple[str, ...]: tuple}


def _declared(cls: type) -> tuple[Setting, ...]:
    """The ``Setting`` records of a settings dataclass, in field order; a bad declaration fails at import."""
    hints = typing.get_type_hints(cls)
    records = []
    for f in fields(cls):
        declaration = f.metadata.get(_DECLARATION)
        if declaration is None:
            continue  # a plain field, not read from the environment (test_unrestricted)
        if hints[f.name] not in _KINDS:
            raise TypeError(f"{cls.__name__}.{f.name}: a setting is int, float, bool, str or tuple[str, ...]")
        if f.default is MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: a setting needs a default")
        if "|" in declaration["doc"] or "\n" in declaration["doc"]:
            raise TypeError(f"{cls.__name__}.{f.name}: a setting's doc is one line without '|' (a table cell)")
        record = Setting(name=f.name, env=env_name(f.name), kind=_KINDS[hints[f.name]], default=f.default,
                         **declaration)  # fmt: skip
        record.check(record.default)
        records.append(record)
    return tuple(records)


class _EnvSettings:
    """What both settings dataclasses share: validation of every field and ``from_env``."""

    SETTINGS: ClassVar[tuple[Setting, ...]] = ()  # filled by ``_with_settings``

    def __post_init__(self) -> None:
        for record in self.SETTINGS:
            object.__setattr__(self, record.name, record.check(getattr(self, record.name)))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Self:
        """The settings from ``environ`` (default ``os.environ``); ``overrides`` win over the environment."""
        env = os.environ if environ is None else environ
        values = {record.name: record.read(env) for record in cls.SETTINGS}
        given = {name: value for name, value in values.items() if value is not None}
        return cls(**{**given, **overrides})


_T = TypeVar("_T", bound=type[_EnvSettings])


def _with_settings(cls: _T) -> _T:
    """Attaches the ``Setting`` records of a settings dataclass (apply it above ``@dataclass``)."""
    cls.SETTINGS = _declared(cls)
    return cls


@_with_settings
@dataclass(frozen=True)
class ServerSettings(_EnvSettings):
    """The episode and wire-level settings of the server."""

    host: str = setting("0.0.0.0", "address the server binds to")
    port: int = setting(8000, "port the server listens on", minimum=1, maximum=65535, fallback="PORT")
    session_cap: int = setting(64, "WebSocket and HTTP sessions together; 429 / CAPACITY_REACHED past it", minimum=1)
    idle_timeout_s: float = setting(900.0, "idle sessions are reaped and their workers killed", minimum=1)
    reveal_truth: bool = setting(True, "show the truth after a train episode ends (test episodes never do)")
    test_salt: str = setting("", "HMAC key of the test split; empty = random per process (set it for comparable runs)")
    public_salt: bool = setting(False, "the test salt is public (a published calibration salt, a test's): the server "
                                "starts with a guessable one, and its runs are listed unranked")  # fmt: skip
    test_instances: int = setting(100, "test instances per task and level", minimum=1)
    api_token: str = setting("", "when set, every route but `/health` needs `Authorization: Bearer <token>`")
    api_tokens: tuple[str, ...] = setting(
        (), "several accepted bearer tokens, comma-separated; each one is a client for `MECHSANDBOX_CLIENT_SHARE`"
    )
    client_share: float = setting(0.25, "largest share of `session_cap` one client may hold (at least one session)",
                                  minimum=0.01, maximum=1)  # fmt: skip
    trusted_proxy: str = setting(
        "", "address or network of the reverse proxy whose `X-Forwarded-For` names the client; empty = none"
    )
    allowed_origins: tuple[str, ...] = setting((), "on a server without tokens, browser origins (`scheme://host"
                                               "[:port]`) besides its own whose POSTs and WebSockets are accepted, "
                                               "comma-separated")  # fmt: skip
    unreset_timeout_s: float = setting(30.0, "sessions never reset or stepped are reaped after this long (a reset "
                                       "still generating counts as use)", minimum=1)  # fmt: skip
    resume_grace_s: float = setting(120.0, "how long an episode whose WebSocket went away is kept for a resume "
                                    "(reset with resume=<token>); 0 = closed at once", minimum=0)  # fmt: skip
    rate_limit: float = setting(0.0, "steps per second per session, 429 past it; 0 = off", minimum=0)
    max_body_bytes: int = setting(256 * 1024, "request bodies and WebSocket messages; 413 past it", minimum=1024)
    default_task: str = setting("dead-neurons", "task of a reset that names none (an id from `mechsandbox tasks`)")
    cache_size: int = setting(64, "generated instances kept in memory (LRU; a transformer is ~1.5 MiB)", minimum=1)
    train_max_steps: int = setting(
        0, "step budget of every train episode (test episodes keep the family's); 0 = the family budgets", minimum=0
    )
    log_level: str = setting("info", "uvicorn and server logging", choices=LOG_LEVELS)
    data_dir: str = setting("", "folder of the embedded SQLite results database (runs and counted attempts); empty = "
                            "the per-user state folder `$XDG_STATE_HOME/mechsandbox` (else `~/.local/state/"
                            "mechsandbox`), made mode 0700 and never inside the sandbox's view; an unwritable one "
                            "falls back to a named temporary folder")  # fmt: skip
    database_url: str = setting("", "results database, e.g. `postgresql://user:pw@host/db` (replicas share one "
                                "leaderboard); empty = SQLite in `MECHSANDBOX_DATA_DIR`")  # fmt: skip
    practice: bool = setting(False, "with a fixed salt, allow test-split resets without a run: played, never scored")
    run_quota: int = setting(5, "runs one submitter may register per UTC day (an IPv6 address by its /64; loopback "
                             "too: local tests and tools raise it); 0 = no limit", minimum=0)  # fmt: skip
    submitters: str = setting("", "bearer tokens grouped into one submitter, `name=tokA,tokB;other=tokC`: their runs "
                              "show under the name and share one `MECHSANDBOX_RUN_QUOTA`; an ungrouped token or "
                              "address is a submitter of its own")  # fmt: skip
    standard_set: int = setting(20, "test instances per family and level that a complete run attempts (indices 0 to "
                                "N-1), capped at `MECHSANDBOX_TEST_INSTANCES`", minimum=1)  # fmt: skip
    prefetch_depth: int = setting(8, "instances generated ahead per task and level for seedless train resets (filled "
                                  "from that pair's first one); 0 = off", minimum=0)  # fmt: skip
    prefetch_total: int = setting(32, "generated-ahead instances kept in all pairs together (a transformer is ~1.5 "
                                  "MiB); 0 = off", minimum=0)  # fmt: skip
    prefetch_cpu_share: float = setting(
        0.5, "share of the time the ahead-of-time generator spends generating (it rests in proportion after each "
        "instance)", minimum=0.05, maximum=1
    )
    prefetch_process: bool = setting(True, "generate ahead in a child process (its own interpreter: generation never "
                                     "holds the server's); off = a thread in the server")  # fmt: skip
    generators: int = setting(2, "child processes that generate cache misses (a named seed, a test instance's first "
                              "reset, a seedless reset with its pool empty), so generation never holds the server's "
                              "interpreter; the first starts after a generation in the server took 50 ms; while "
                              "they start or are all busy the server generates; 0 = always the server",
                              minimum=0)  # fmt: skip
    prefetch_pairs: tuple[str, ...] = setting((), "`task/level` pairs filled at startup (e.g. `committee-circuit/hard`)"
                                              "; the others start at their first seedless reset")  # fmt: skip
    replica_id: str = setting("", "this replica's name behind a load balancer (letters, digits, `-`, up to 63): HTTP "
                              "episode ids start with `<name>.` so `/step` routes back (docs/DEPLOY.md)")  # fmt: skip
    drain_s: float = setting(0.0, "on SIGTERM (`mechsandbox serve`), leave rotation (`/health` 503, `/ready` 404), "
                             "refuse new episodes after the notice and let live sessions "
                             "finish for up to this long before stopping; 0 = stop at once", minimum=0)  # fmt: skip
    drain_notice_s: float = setting(6.0, "while draining, seconds new episodes are still accepted (a load balancer's "
                                    "check needs that long to take the replica out)", minimum=0)  # fmt: skip
    web: bool = setting(True, "serve the playground at `/web` and the run viewer at `/web/runs` (docs/WEB.md)")
    run_dirs: tuple[str, ...] = setting((), "eval run folders the run viewer shows, comma-separated (a folder of "
                                        "runs is listed run by run)")  # fmt: skip
    prewarm_test: tuple[str, ...] = setting(
        (), "`task/level` pairs whose standard set of test instances is generated at startup, into the instance cache "
        "(progress in the log and /health)"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("prefetch_pairs", "prewarm_test"):
            for pair in getattr(self, name):
                task, _, level = pair.partition("/")
                # tasks.LEVELS, not imported here (the task registry pulls torch); the task id is checked at startup
                if not task or level not in ("easy", "medium", "hard"):
                    raise ValueError(f"{env_name(name)}: {pair!r} is not task/level (e.g. copy-head/hard)")
        if self.replica_id and not REPLICA_ID.fullmatch(self.replica_id):
            raise ValueError(f"{env_name('replica_id')}={self.replica_id!r}: use letters, digits and '-' (up to 63)")
        if self.trusted_proxy:
            try:
                ipaddress.ip_network(self.trusted_proxy, strict=False)
            except ValueError:
                raise ValueError(
                    f"{env_name('trusted_proxy')}={self.trusted_proxy!r} is not an IP address or network"
                ) from None

    @property
    def tokens(self) -> tuple[str, ...]:
        """Every accepted bearer token (``api_token`` and ``api_tokens`` together); empty = no authentication."""
        return tuple(dict.fromkeys(t for t in (self.api_token, *self.api_tokens) if t))

    def client_quota(self) -> int:
        """Sessions one client may hold at once: ``client_share`` of the cap, at least one."""
        return max(1, math.floor(self.client_share * self.session_cap + 1e-9))


@_with_settings
@dataclass(frozen=True)
class SandboxSettings(_EnvSettings):
    """The sandbox pool's settings: workers, limits and isolation layers (docs/SANDBOX.md)."""

    pool_size: int = setting(4, "warm, model-less sandbox workers kept ready", minimum=0)
    spawn_parallel: int = setting(4, "workers the warm pool starts at once while it refills", minimum=1)
    wall_seconds: float = setting(10.0, "CPU-time limit per snippet (user + system of its own worker, all threads; "
                                  "the name is historical): a busy machine slows snippets, never fails them",
                                  minimum=0.1)  # fmt: skip
    wall_backstop_seconds: float = setting(60.0, "wall-clock backstop per snippet, for a worker that waits without "
                                           "using CPU (never below `MECHSANDBOX_WALL_SECONDS`)",
                                           minimum=1)  # fmt: skip
    worker_memory_mb: int = setting(
        2048, "address space per worker above the zygote's measured baseline (docs/SANDBOX.md)", minimum=64
    )
    memory_budget_mb: int = setting(
        0, "all workers' private memory together (the watchdog kills the largest); 0 = RAM minus 4 GiB", minimum=0
    )
    cpu_seconds: int = setting(900, "RLIMIT_CPU per worker, its whole life (a backstop; the per-snippet limit acts "
                               "first)", minimum=1)  # fmt: skip
    uid_drop: str = setting("auto", "run workers as a per-slot uid: when possible, always, or never",
                            choices=("auto", "force", "off"))  # fmt: skip
    landlock: bool = setting(True, "Landlock layer (switch off for diagnosis only)")
    seccomp: bool = setting(True, "seccomp layer (switch off for diagnosis only)")
    rlimits: bool = setting(True, "resource-limit layer (switch off for diagnosis only)")
    namespaces: bool = setting(True, "run the zygote and workers in their own namespaces (bubblewrap) when possible")
    max_pids: int = setting(64, "processes and threads per worker (pids cgroup; RLIMIT_NPROC where none)", minimum=8)
    require: tuple[str, ...] = setting((), "layers that must be active, else the pool refuses to start",
                                       choices=KNOWN_LAYERS, items="layers")  # fmt: skip
    output_cap: int = setting(64 * 1024, "bytes of stdout kept per snippet", minimum=1)
    error_cap: int = setting(2048, "bytes of error text kept per snippet", minimum=1)
    watchdog_interval: float = setting(0.5, "seconds between the memory watchdog's polls", minimum=0.01)
    snippet_nice: int = setting(0, "niceness a worker takes once its model is loaded, so that on a busy machine "
                                "snippets yield to resets, loads and the server (5: shorter reset tails, docs/"
                                "PERFORMANCE.md); 0 = off", minimum=0, maximum=19)  # fmt: skip
    max_workers: int = setting(320, "worker slots (and per-slot uids) in all: every live session's worker and the "
                               "warm pool's, so at least the session cap plus `MECHSANDBOX_POOL_SIZE`",
                               minimum=1)  # fmt: skip
    # Test-only, never read from the environment: lets a test worker run the "unrestricted" op.
    test_unrestricted: bool = field(default=False, repr=False)

    def budget_bytes(self) -> int:
        """The memory budget in bytes (``memory_budget_mb``, or RAM minus 4 GiB and at least 1 GiB)."""
        if self.memory_budget_mb > 0:
            return self.memory_budget_mb * 1024 * 1024
        return max(_total_ram() - 4 * 1024**3, 1024**3)


def _total_ram() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


SETTINGS: tuple[Setting, ...] = ServerSettings.SETTINGS + SandboxSettings.SETTINGS
"""The registry: every setting, server first, in declaration order."""

REGISTRY: dict[str, Setting] = {record.env: record for record in SETTINGS}
"""The same settings by environment variable."""
if len(REGISTRY) != len(SETTINGS):
    raise TypeError("two settings share an environment variable (a field name in both classes)")


def markdown_table() -> str:
    """The README's settings table (between its ``settings:start`` / ``settings:end`` markers)."""
    lines = ["| variable | default | values | meaning |", "|---|---|---|---|"]
    for record in SETTINGS:
        variable = f"`{record.env}`" + (f" (or `{record.fallback}`)" if record.fallback else "")
        default = record.default_text()
        default = default if default.startswith("(") else f"`{default}`"
        lines.append(f"| {variable} | {default} | {record.values_text()} | {record.doc} |")
    return "\n".join(lines) + "\n"


def text_table() -> str:
    """The same table for a terminal: variable, default and meaning, one setting a line."""
    width = max(len(record.env) for record in SETTINGS)
    rows = []
    for record in SETTINGS:
        values = record.values_text().replace("`", "")
        rows.append(f"{record.env:{width}}  {record.default_text():12}  {record.doc} [{values}]")
    return "\n".join(rows) + "\n"
