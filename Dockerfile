# MechSandbox server image (CPU). Build: docker build -t mechsandbox .   Run: docker run -p 8000:8000 mechsandbox
# Offline (no image registry, no PyTorch index): docker/build-local.sh makes the base from Debian packages, tags it
# python:3.11-slim, puts the local torch wheel in docker/wheels/ and builds this file unchanged (docs/DEPLOY.md).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0

# ENABLE_WEB_INTERFACE=false keeps OpenEnv's Gradio UI off: the server serves its own playground and run viewer at
# /web (MECHSANDBOX_WEB, docs/WEB.md), which play by its sessions and limits.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ENABLE_WEB_INTERFACE=false \
    MECHSANDBOX_HOST=0.0.0.0 \
    PORT=8000

# libseccomp2 for the sandbox's seccomp layer (Landlock needs no library); bubblewrap for its jail
# (namespaces; used where the container may create them, else /health says why not: docs/SANDBOX.md).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libseccomp2 bubblewrap \
    && rm -rf /var/lib/apt/lists/*

COPY . /tmp/mechsandbox-src
RUN TORCH_INDEX_URL="$TORCH_INDEX_URL" TORCH_VERSION="$TORCH_VERSION" sh /tmp/mechsandbox-src/docker/install.sh /tmp/mechsandbox-src \
    && rm -rf /tmp/mechsandbox-src

# Non-root: the sandbox then relies on Landlock + seccomp + rlimits (the per-worker uid drop needs root).
RUN useradd --create-home --uid 1000 mechsandbox
USER mechsandbox
WORKDIR /home/mechsandbox
# The results database (runs, counted attempts) when MECHSANDBOX_DATABASE_URL is unset: mount a volume here
# (-v mechsandbox-data:/home/mechsandbox/data) to keep the leaderboard across containers, or point
# MECHSANDBOX_DATABASE_URL at a PostgreSQL shared by replicas. No VOLUME instruction: OpenEnv's runtime validation
# refuses images that declare one; run read-only (--read-only --tmpfs /tmp) or as another uid, the server falls back
# to a temporary folder and says so in its log.
ENV MECHSANDBOX_DATA_DIR=/home/mechsandbox/data
RUN mkdir -p /home/mechsandbox/data

EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD python -c "import os, sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PORT', '8000'), timeout=8).status != 200)"

CMD ["mechsandbox", "serve"]
