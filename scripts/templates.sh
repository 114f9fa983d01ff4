#!/usr/bin/env bash
# Prints the folder of llama.cpp's chat templates (models/templates/*.jinja from the pinned
# llama-cpp-python sdist) that tests/test_chat_templates.py reads, fetching it into
# ~/.cache/specdeck/templates/ first if needed (see tests/support/templates.py). $1: the Python to use.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
cd "$ROOT/tests" && exec "$PY" -c 'from support.templates import templates_dir; print(templates_dir())'
