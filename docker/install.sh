#!/bin/sh
# Install MechSandbox with a CPU build of torch into the current Python environment.
# The Dockerfile runs this, and tests/test_container.py runs it in a clean virtualenv, so the
# image's install steps are tested even where no Docker engine runs.
#   TORCH_INDEX_URL  where torch comes from (default in the Dockerfile: the PyTorch CPU index;
#                    empty = pip's own configuration, e.g. a local wheel directory)
#   TORCH_VERSION    default 2.13.0
set -eu
SRC=${1:-.}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
# A torch wheel placed in docker/wheels/ (docker/build-local.sh does) is the fallback when the index is unreachable.
local_wheel() {
    for wheel in "$SRC"/docker/wheels/torch-"$TORCH_VERSION"*.whl; do
        [ -f "$wheel" ] && { echo "$wheel"; return 0; }
    done
    return 1
}
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    if ! python -m pip install --no-cache-dir --timeout 20 --retries 1 --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"; then
        wheel=$(local_wheel) || { echo "docker/install.sh: $TORCH_INDEX_URL is unreachable and docker/wheels/ holds no torch $TORCH_VERSION wheel" >&2; exit 1; }
        echo "docker/install.sh: $TORCH_INDEX_URL is unreachable; installing $wheel" >&2
        python -m pip install --no-cache-dir "$wheel"
    fi
else
    python -m pip install --no-cache-dir "torch==$TORCH_VERSION"
fi
python -m pip install --no-cache-dir "$SRC[postgres]"  # the PostgreSQL driver, for MECHSANDBOX_DATABASE_URL
# The artifacts ship in the package; regenerate them in memory and compare bytes with the manifest.
if ! python -m mechsandbox.cli gen-art --check --quiet; then
    echo "docker/install.sh: warning: artifacts differ on this platform (truth is unaffected; see docs/CONTRACT.md)" >&2
fi
