#!/bin/sh
# One entry point for developers and CI, on a fresh clone with only Python 3.11+, pip and a POSIX shell.
#   ./dev.sh test [pytest args]   create .venv on first use, install, run the whole test suite (with args: pytest's)
#   ./dev.sh serve                create .venv on first use, install, run the server
#   ./dev.sh lint                 ruff
# The venv is reinstalled when pyproject.toml changes. torch is installed first and pinned to 2.13.0
# (a CPU wheel); a bare newer torch would pull a multi-GB CUDA build.
set -eu
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${MECHSANDBOX_VENV:-.venv}
TORCH_PIN=${MECHSANDBOX_TORCH:-torch==2.13.0}

setup() {
    # The sandbox's jail needs bubblewrap (docs/SANDBOX.md); as root on Debian, install it when missing.
    if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "dev.sh: installing bubblewrap (the sandbox's namespace jail)" >&2
        (apt-get update -qq && apt-get install -y -qq --no-install-recommends bubblewrap) >/dev/null ||
            echo "dev.sh: could not install bubblewrap; the sandbox runs without its jail" >&2
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -c 'import sys; assert sys.version_info >= (3, 11), "MechSandbox needs Python 3.11+"'
        "$PY" -m venv "$VENV"
    fi
    stamp="$VENV/.mechsandbox-installed"
    want=$(cat pyproject.toml | cksum)
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        echo "dev.sh: installing into $VENV (first use or pyproject.toml changed)" >&2
        "$VENV/bin/python" -m pip install -q --upgrade pip
        "$VENV/bin/python" -m pip install -q "$TORCH_PIN"
        "$VENV/bin/python" -m pip install -q -e '.[dev]'
        echo "$want" > "$stamp"
    fi
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
    test)
        setup
        if [ $# -gt 0 ]; then
            exec "$VENV/bin/python" -m pytest "$@"
        fi
        # The whole suite: everything on xdist workers, then the tests marked `alone` (a busy-machine load test that
        # starts its own CPU hogs) in one process with nothing beside them.
        status=0
        "$VENV/bin/python" -m pytest -m "not alone" || status=$?
        "$VENV/bin/python" -m pytest -m alone -n 0 || status=$?
        exit "$status"
        ;;
    serve)
        setup
        exec "$VENV/bin/mechsandbox" serve "$@"
        ;;
    lint)
        setup
        exec "$VENV/bin/ruff" check . "$@"
        ;;
    *)
        echo "usage: ./dev.sh test|serve|lint [args]" >&2
        exit 2
        ;;
esac
