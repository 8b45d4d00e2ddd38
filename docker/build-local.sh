#!/bin/sh
# Build the server image where no image registry and no PyTorch index can be reached (issue 24, docs/DEPLOY.md),
# and optionally start it. The Dockerfile is built unchanged:
#   1. the base: this machine's Debian release (bookworm: Python 3.11, as python:3.11-slim) made by mmdebstrap from
#      Debian packages, with the host's CA bundle (a TLS-intercepting proxy between the build and PyPI is then
#      trusted) and `python` on PATH, tagged python:3.11-slim: the name the Dockerfile's FROM uses by default;
#   2. torch: a local wheel ($TORCH_WHEEL, else what this machine's pip resolves for torch==$TORCH_VERSION) copied
#      to docker/wheels/, which docker/install.sh installs when the PyTorch index is unreachable;
#   3. `$ENGINE build -t $TAG .` with no build arguments (as `openenv validate` builds).
#
#   docker/build-local.sh [--rebuild-base] [--run PORT]
#   docker/build-local.sh --base-only   (steps 1 and 2: then build with any client, e.g. `docker build` against
#                                        podman's Docker API, whose builds share layers with each other, not with
#                                        the podman CLI's: tests/test_container_image.py)
#   docker/build-local.sh --print-engine-args   (only what a run needs here; the base must exist)
#
# ENGINE (podman, else docker), TAG (mechsandbox:local), TORCH_VERSION (2.13.0). ENGINE_ARGS: extra arguments of
# every build and run. Unset, the script tries the engine's defaults and, if a container cannot start (podman
# inside another container: crun refuses hybrid cgroups and raising rlimits), falls back to
# "--runtime runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024" and says so.
set -eu
cd "$(dirname "$0")/.."
ENGINE=${ENGINE:-$(command -v podman >/dev/null 2>&1 && echo podman || echo docker)}
TAG=${TAG:-mechsandbox:local}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
BASE=python:3.11-slim
RAW=mechsandbox-base-raw:bookworm
FALLBACK_ARGS="--runtime runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
rebuild=0
port=""
print_args=0
base_only=0
while [ $# -gt 0 ]; do
    case "$1" in
        --rebuild-base) rebuild=1 ;;
        --run) port=${2:?--run needs a port}; shift ;;
        --print-engine-args) print_args=1 ;;
        --base-only) base_only=1 ;;
        *) echo "usage: docker/build-local.sh [--rebuild-base] [--run PORT | --base-only] | --print-engine-args" >&2
           exit 2 ;;
    esac
    shift
done
say() { echo "build-local: $*" >&2; }
command -v "$ENGINE" >/dev/null 2>&1 || { say "no container engine ($ENGINE): apt-get install podman"; exit 1; }

# What a container needs to start here, probed on the base image: nothing, or FALLBACK_ARGS ($ENGINE_ARGS wins).
probe_engine_args() {
    [ -n "${ENGINE_ARGS+set}" ] && return 0
    if $ENGINE run --rm "$RAW" true >/dev/null 2>&1; then
        ENGINE_ARGS=""
    elif $ENGINE run --rm $FALLBACK_ARGS "$RAW" true >/dev/null 2>&1; then
        ENGINE_ARGS=$FALLBACK_ARGS
        say "containers start only with: $ENGINE_ARGS (used for every build and run below)"
    else
        say "$ENGINE cannot start a container here:"
        $ENGINE run --rm $FALLBACK_ARGS "$RAW" true >&2 || true
        exit 1
    fi
}
if [ "$print_args" = 1 ]; then
    $ENGINE image inspect "$RAW" >/dev/null 2>&1 || { say "no base image $RAW yet: run docker/build-local.sh first"; exit 1; }
    probe_engine_args 2>/dev/null
    echo "$ENGINE_ARGS"
    exit 0
fi

# 1. the base image
if [ "$rebuild" = 1 ] || ! $ENGINE image inspect "$RAW" >/dev/null 2>&1; then
    command -v mmdebstrap >/dev/null 2>&1 || { say "mmdebstrap is missing: apt-get install mmdebstrap"; exit 1; }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    say "making the base from Debian packages (mmdebstrap, about a minute)"
    mmdebstrap --quiet --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
        "$(. /etc/os-release && echo "$VERSION_CODENAME")" "$tmp/base.tar"
    $ENGINE import "$tmp/base.tar" "$RAW" >/dev/null
fi
probe_engine_args
ctx=$(mktemp -d)
cp /etc/ssl/certs/ca-certificates.crt "$ctx/ca-certificates.crt"
cat > "$ctx/Containerfile" <<EOF
FROM $RAW
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# as the official image: \`python\` on PATH and pip free to install system-wide (no PEP 668 marker)
RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED && ln -sf /usr/bin/python3 /usr/local/bin/python
EOF
say "tagging the base as $BASE"
# shellcheck disable=SC2086
$ENGINE build --quiet $ENGINE_ARGS -t "$BASE" "$ctx" >/dev/null
rm -rf "$ctx"

# 2. the torch wheel
mkdir -p docker/wheels
if ! ls docker/wheels/torch-"$TORCH_VERSION"*.whl >/dev/null 2>&1; then
    if [ -n "${TORCH_WHEEL:-}" ]; then
        cp "$TORCH_WHEEL" docker/wheels/
    else
        say "fetching torch==$TORCH_VERSION as this machine's pip resolves it (a local wheel where one is configured)"
        python3 -m pip download --quiet --no-deps --only-binary :all: -d docker/wheels "torch==$TORCH_VERSION"
    fi
fi

[ "$base_only" = 1 ] && { say "base $BASE and the torch wheel ready"; exit 0; }

# 3. the image, built as everyone builds it
say "building $TAG"
started=$(date +%s)
# shellcheck disable=SC2086
$ENGINE build $ENGINE_ARGS -t "$TAG" .
say "built $TAG in $(( $(date +%s) - started )) s"
if [ -n "$port" ]; then
    # shellcheck disable=SC2086
    $ENGINE run -d --rm --name mechsandbox-local $ENGINE_ARGS -p "$port:8000" "$TAG"
    say "started: http://127.0.0.1:$port/health (stop: $ENGINE stop mechsandbox-local)"
fi
