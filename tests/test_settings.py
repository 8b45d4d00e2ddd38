"""The settings registry (``mechsandbox.settings``): parsing, validation, the README table, coverage.

Why: every deployment knob is declared once and everything else (parsing, checks, docs) is derived
from the declarations, so these tests hold the derivations to them: each setting round-trips
through the environment, bad values fail with a line naming the variable, the README's table is
the generated one, and no ``MECHSANDBOX_*`` variable is read without being declared.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
from mechsandbox import settings
from mechsandbox.settings import REGISTRY, SETTINGS, SandboxSettings, ServerSettings, Setting, env_name, setting

ROOT = Path(__file__).resolve().parents[1]
CLASSES = (ServerSettings, SandboxSettings)
OWNER = {record.env: cls for cls in CLASSES for record in cls.SETTINGS}

# MECHSANDBOX_* names that are read but are not deployment settings, so they stay out of the registry.
# Each is named in the README next to the settings table.
NOT_SETTINGS = {
    "MECHSANDBOX_VENV": "dev.sh: where the development venv lives",
    "MECHSANDBOX_TORCH": "dev.sh: the torch requirement installed first",
    "MECHSANDBOX_TOOLS": "tests/test_packaging.py: a cache of tool venvs (openenv-core 0.3.0)",
    "MECHSANDBOX_TEST_SECRET": "tests/test_sandbox_attacks.py: a canary that must not reach the zygote",
    "MECHSANDBOX_TEST_INSTANCE_DIR": "tests/conftest.py: the run's instance cache folder, shared by xdist workers",
    "MECHSANDBOX_URL": "integrations/mcp_client.py: the server an Inspect eval or a TRL environment plays on "
    "(a client's setting)",
    "MECHSANDBOX_FULL_SWEEP": "tests/sweep_truths.py: regenerate all 100 seeds of the recorded families' sweeps",
    "MECHSANDBOX_SCREENSHOTS": "tests/test_web.py: a folder that also receives the browser tests' screenshots",
}
SKIPPED_DIRS = {".git", ".venv", "__pycache__", "build", "dist", "mechsandbox.egg-info", ".ruff_cache"}


def sample(record: Setting) -> object:
    """A valid value different from the default."""
    if record.kind is bool:
        return not record.default
    if record.kind is tuple:
        if record.name in ("prefetch_pairs", "prewarm_test"):  # task/level pairs, checked in ServerSettings
            return ("copy-head/hard", "dead-neurons/easy")
        return record.choices[1:3] if record.choices else ("a", "b")
    if record.kind is str:
        if record.name == "trusted_proxy":  # an address, checked in ServerSettings.__post_init__
            return "10.0.0.1"
        return next(c for c in record.choices if c != record.default) if record.choices else "some-text"
    step = 1 if record.kind is int else 0.25
    if record.maximum is not None and record.default + step > record.maximum:
        step = -step
    return record.default + step


def test_the_registry_is_every_field_but_the_test_switch() -> None:
    assert len(SETTINGS) == 58 and set(REGISTRY) == {record.env for record in SETTINGS}
    for cls in CLASSES:
        declared = {record.name for record in cls.SETTINGS}
        assert declared == {f.name for f in fields(cls)} - {"test_unrestricted"}
        assert all(record.env == env_name(record.name) for record in cls.SETTINGS)


@pytest.mark.parametrize("record", SETTINGS, ids=lambda r: r.env)
def test_each_setting_parses_from_the_environment_and_round_trips(record: Setting) -> None:
    cls = OWNER[record.env]
    assert getattr(cls(), record.name) == record.default == getattr(cls.from_env({}), record.name)
    value = sample(record)
    raw = record.show(value)
    parsed = getattr(cls.from_env({record.env: raw}), record.name)
    assert parsed == value and record.show(parsed) == raw
    assert getattr(cls(**{record.name: value}), record.name) == value
    assert getattr(cls.from_env({record.env: raw}, **{record.name: record.default}), record.name) == record.default


@pytest.mark.parametrize("record", [r for r in SETTINGS if r.kind in (int, float)], ids=lambda r: r.env)
def test_numbers_outside_their_range_or_of_the_wrong_type_are_refused(record: Setting) -> None:
    cls = OWNER[record.env]
    with pytest.raises(ValueError, match=rf"^{record.env}='many' is not an? "):
        cls.from_env({record.env: "many"})
    with pytest.raises(ValueError, match=rf"^{record.env}=True is not an? "):
        cls(**{record.name: True})
    if record.minimum is not None:
        assert getattr(cls.from_env({record.env: record.show(record.minimum)}), record.name) == record.minimum
        below = record.minimum - (1 if record.kind is int else 0.001)
        with pytest.raises(ValueError, match=rf"^{record.env}=\S+ is out of range: must be "):
            cls.from_env({record.env: record.show(below)})
        with pytest.raises(ValueError, match=rf"^{record.env}=\S+ is out of range: must be "):
            cls(**{record.name: below})


@pytest.mark.parametrize(
    ("cls", "environ", "message"),
    [
        (ServerSettings, {"MECHSANDBOX_SESSION_CAP": "0"}, "MECHSANDBOX_SESSION_CAP=0 is out of range: must be >= 1"),
        (ServerSettings, {"PORT": "70000"}, "PORT=70000 is out of range: must be between 1 and 65535"),
        (ServerSettings, {"MECHSANDBOX_IDLE_TIMEOUT_S": "inf"}, "MECHSANDBOX_IDLE_TIMEOUT_S=inf is not a finite"),
        (ServerSettings, {"MECHSANDBOX_REVEAL_TRUTH": "maybe"}, "MECHSANDBOX_REVEAL_TRUTH='maybe' is not a boolean"),
        (ServerSettings, {"MECHSANDBOX_LOG_LEVEL": "loud"}, "MECHSANDBOX_LOG_LEVEL=loud is not allowed: must be one"),
        (SandboxSettings, {"MECHSANDBOX_UID_DROP": "sometimes"},
         "MECHSANDBOX_UID_DROP=sometimes is not allowed: must be one of auto, force, off"),
        (SandboxSettings, {"MECHSANDBOX_REQUIRE": "landlock, magic"},
         "MECHSANDBOX_REQUIRE=landlock,magic names unknown layers ['magic']; known: rlimits, uid, landlock, seccomp"),
        (SandboxSettings, {"MECHSANDBOX_POOL_SIZE": "2.5"}, "MECHSANDBOX_POOL_SIZE='2.5' is not an integer"),
    ],
)  # fmt: skip
def test_bad_values_fail_with_one_line_naming_the_variable(cls: type, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as error:
        cls.from_env(environ)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_direct_construction_and_overrides_are_checked_too() -> None:
    with pytest.raises(ValueError, match=r"^MECHSANDBOX_SESSION_CAP=0 is out of range"):
        ServerSettings.from_env({}, session_cap=0)
    with pytest.raises(ValueError, match=r"^MECHSANDBOX_UID_DROP=sometimes is not allowed"):
        SandboxSettings(uid_drop="sometimes")
    with pytest.raises(ValueError, match=r"^MECHSANDBOX_REQUIRE=magic names unknown layers"):
        SandboxSettings(pool_size=1, require=("magic",))
    with pytest.raises(ValueError, match=r"^MECHSANDBOX_WALL_SECONDS='3' is not a finite number"):
        SandboxSettings(wall_seconds="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ServerSettings.from_env({}, no_such_setting=1)
    widened = SandboxSettings(pool_size=1, wall_seconds=3, require=["seccomp"], test_unrestricted=True)  # type: ignore[arg-type]
    assert widened.wall_seconds == 3.0 and isinstance(widened.wall_seconds, float)
    assert widened.require == ("seccomp",) and widened.test_unrestricted is True


def test_special_cases() -> None:
    assert ServerSettings.from_env({"PORT": "9000"}).port == 9000
    assert ServerSettings.from_env({"PORT": "9000", "MECHSANDBOX_PORT": "9001"}).port == 9001
    assert ServerSettings.from_env({"PORT": "9000"}, port=9002).port == 9002
    require = SandboxSettings.from_env({"MECHSANDBOX_REQUIRE": " landlock, seccomp ,"}).require
    assert require == ("landlock", "seccomp") and SandboxSettings.from_env({"MECHSANDBOX_REQUIRE": ""}).require == ()
    for raw, value in (("1", True), ("YES", True), ("on", True), ("0", False), ("False", False), ("off", False)):
        assert SandboxSettings.from_env({"MECHSANDBOX_SECCOMP": raw}).seccomp is value
    assert SandboxSettings.from_env({env_name("test_unrestricted"): "true"}).test_unrestricted is False
    assert "test_unrestricted" not in repr(SandboxSettings(test_unrestricted=True))
    assert SandboxSettings(memory_budget_mb=2048).budget_bytes() == 2048 * 1024**2
    ram = settings._total_ram()
    assert SandboxSettings().budget_bytes() == max(ram - 4 * 1024**3, 1024**3)


def test_a_bad_declaration_fails_when_the_class_is_made() -> None:
    @dataclass(frozen=True)
    class OutOfRange(settings._EnvSettings):
        knob: int = setting(0, "a default below its own minimum", minimum=1)

    @dataclass(frozen=True)
    class Unsupported(settings._EnvSettings):
        knob: bytes = setting(b"", "a type with no parser")

    with pytest.raises(ValueError, match="out of range"):
        settings._with_settings(OutOfRange)
    with pytest.raises(TypeError, match="int, float, bool, str or tuple"):
        settings._with_settings(Unsupported)


def test_the_readme_table_is_the_generated_one() -> None:
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- settings:start -->\n(.*?)<!-- settings:end -->", readme, re.S)
    assert found, "README.md lacks the <!-- settings:start --> / <!-- settings:end --> markers"
    assert found.group(1) == settings.markdown_table(), (
        "README.md's settings table differs from the declarations: paste `mechsandbox settings --markdown` "
        "between its settings:start / settings:end markers"
    )
    for name in NOT_SETTINGS:
        assert f"`{name}`" in readme, f"{name} is read somewhere but the README does not name it"


def test_the_cli_prints_the_tables() -> None:
    cli = [sys.executable, "-m", "mechsandbox.cli", "settings"]
    markdown = subprocess.run([*cli, "--markdown"], capture_output=True, text=True, check=True).stdout
    assert markdown == settings.markdown_table()
    text = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
    assert [line.split()[0] for line in text.splitlines()] == [record.env for record in SETTINGS]


def source_files() -> list[Path]:
    """Every file that could read an environment variable: Python sources, shell scripts, the Dockerfile."""
    found = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if name not in SKIPPED_DIRS]
        for name in names:
            path = Path(folder, name)
            if path.suffix in (".py", ".sh") or name == "Dockerfile" or path.parent.name == ".ci":
                found.append(path)
    return found


def test_no_undeclared_mechsandbox_variable_is_read() -> None:
    used: dict[str, set[str]] = {}
    for path in source_files():
        for name in re.findall(r"MECHSANDBOX_[A-Z_]+", path.read_text(errors="replace")):
            used.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    undeclared = {name: sorted(where) for name, where in used.items() if name not in REGISTRY | NOT_SETTINGS}
    assert not undeclared, f"declare these in mechsandbox/settings.py (or allowlist a test-only name): {undeclared}"
    stale = set(NOT_SETTINGS) - set(used)
    assert not stale, f"allowlisted but no longer used anywhere: {sorted(stale)}"


def test_the_module_imports_neither_torch_nor_the_task_families() -> None:
    code = (
        "import sys, mechsandbox.settings\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('mechsandbox.tasks')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    "variable,raw,pattern",
    [
        ("MECHSANDBOX_CLIENT_SHARE", "0", r"is out of range: must be between 0\.01 and 1"),
        ("MECHSANDBOX_CLIENT_SHARE", "1.5", r"is out of range"),
        ("MECHSANDBOX_CLIENT_SHARE", "-0.25", r"is out of range"),
        ("MECHSANDBOX_TRUSTED_PROXY", "proxy.internal", r"is not an IP address or network"),
        ("MECHSANDBOX_TRUSTED_PROXY", "10.0.0.300", r"is not an IP address or network"),
    ],
)
def test_bad_quota_settings_are_a_startup_error(variable: str, raw: str, pattern: str) -> None:
    with pytest.raises(ValueError, match=rf"^{variable}=\S+ {pattern}"):
        ServerSettings.from_env({variable: raw})


def test_quota_arithmetic_and_tokens() -> None:
    assert ServerSettings().client_quota() == 16  # 0.25 of 64
    assert ServerSettings(session_cap=3, client_share=0.25).client_quota() == 1  # at least one session
    assert ServerSettings(session_cap=6, client_share=0.5).client_quota() == 3
    both = ServerSettings.from_env({"MECHSANDBOX_API_TOKEN": "a", "MECHSANDBOX_API_TOKENS": "b, c,a"})
    assert both.tokens == ("a", "b", "c")
    assert ServerSettings(trusted_proxy="10.1.0.0/16").trusted_proxy == "10.1.0.0/16"
