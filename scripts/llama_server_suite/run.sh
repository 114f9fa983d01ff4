#!/usr/bin/env bash
# Run llama.cpp's server test suite (tools/server/tests) against specdeck through
# llama-server-shim. Usage: scripts/llama_server_suite/run.sh [pytest args, e.g. unit/test_tokenize.py]
# Results: scripts/llama_server_suite/results/{pytest.log,junit.xml}
# Env: PER_TEST_TIMEOUT (s, default 240), SUITE_WALL (s, default 3600), SLOW_TESTS=1, PORT, SHIM_MODEL.
# To stop early and still get the summary: kill -INT <pid of the pytest process>.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
SRC="${LLAMA_CPP_SRC:-$HOME/.cache/specdeck/cuda-build/src/llama_cpp_python-0.3.36/vendor/llama.cpp}"
SUITE="$HERE/suite"                       # mirrors llama.cpp's layout so ../../../models/templates resolves
TESTS="$SUITE/tools/server/tests"
VENV="${SUITE_VENV:-/tmp/llsuite-venv}"   # never the project's .venv
PER_TEST_TIMEOUT="${PER_TEST_TIMEOUT:-240}"
WALL="${SUITE_WALL:-3600}"                # whole run, seconds; SIGINT at the end so pytest still reports
RESULTS="$HERE/results"

if [ ! -d "$TESTS/unit" ]; then
  [ -d "$SRC/tools/server/tests/unit" ] || { echo "suite not found under $SRC" >&2; exit 1; }
  mkdir -p "$TESTS" "$SUITE/models"
  cp -r "$SRC/tools/server/tests/." "$TESTS/"
  cp -r "$SRC/models/templates" "$SUITE/models/"
  [ -d "$SRC/tools/mtmd" ] && mkdir -p "$SUITE/tools/mtmd" && cp "$SRC"/tools/mtmd/*.jpeg "$SUITE/tools/mtmd/" 2>/dev/null || true
fi

if [ ! -x "$VENV/bin/pytest" ] || ! "$VENV/bin/python" -c "import pytest_timeout, wget, aiohttp" 2>/dev/null; then
  "$REPO/.venv/bin/python" -m venv "$VENV"
  "$VENV/bin/pip" install -q pytest pytest-timeout requests openai filelock numpy prometheus-client wget aiohttp
fi

MODEL="${SHIM_MODEL:-$(ls "$HOME"/.cache/specdeck/models/*/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf | head -1)}"
export SHIM_MODEL="$MODEL"
# test_speculative.py downloads its draft into ./tmp unless the file is there: serve the same GGUF.
mkdir -p "$TESTS/tmp"
[ -e "$TESTS/tmp/stories15M-q4_0.gguf" ] || ln -s "$MODEL" "$TESTS/tmp/stories15M-q4_0.gguf"

export LLAMA_SERVER_BIN_PATH="$HERE/llama-server-shim"
export PORT="${PORT:-18080}"
export LLAMA_CACHE="$TESTS/tmp"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$RESULTS"

cd "$TESTS"
# default: every file, the core routes first, the files needing models specdeck lacks last
ORDER="basic tokenize completion chat_completion infill template ctx_shift ignore_eos kv_keep_only_active
  stream compat_oai_responses compat_anthropic compat_gcp metrics security proxy sleep slot_save speculative
  tool_call tools_builtin mcp_servers router embedding rerank lora vision_api"
FILES_LIST=()
if [ -n "${FILES:-}" ]; then
  for f in $FILES; do FILES_LIST+=("unit/test_$f.py"); done
else
  for f in $ORDER; do FILES_LIST+=("unit/test_$f.py"); done
  for f in unit/test_*.py; do case " ${FILES_LIST[*]} " in *" $f "*) ;; *) FILES_LIST+=("$f");; esac; done
fi
# like upstream tests.sh: tests marked slow (they download 1.5B-8B models) only with SLOW_TESTS=1
MARK=(-m "not slow"); [ "${SLOW_TESTS:-0}" = 1 ] && MARK=()

run_pytest() {  # run_pytest WALL_SECONDS NAME PYTEST_ARGS...
  local wall=$1 name=$2; shift 2
  timeout --signal=INT --kill-after=60 "$wall" \
    nice -n 10 "$VENV/bin/python" -m pytest -p shim_plugin -p no:cacheprovider \
      -v -rfE --timeout="$PER_TEST_TIMEOUT" --junitxml="$RESULTS/junit-$name.xml" "${MARK[@]}" "$@" \
      2>&1 | tee "$RESULTS/pytest-$name.log"
  return "${PIPESTATUS[0]}"
}

[ "${KEEP_RESULTS:-0}" = 1 ] || rm -f "$RESULTS"/junit-*.xml "$RESULTS"/pytest-*.log "$RESULTS"/collected.txt
# what each file would run (for the "not run" column of the summary)
"$VENV/bin/python" -m pytest -p shim_plugin -p no:cacheprovider --collect-only -q "${MARK[@]}" "${FILES_LIST[@]}" 2>/dev/null \
  | grep '::' > "$RESULTS/collected.txt" || true

set +e
if [ -z "${PER_FILE_WALL:-}" ]; then
  # one pytest session over all files; extra arguments go to pytest (they may name files instead)
  if [ $# -gt 0 ] && [[ "$1" != -* ]]; then run_pytest "$WALL" all "$@"; else run_pytest "$WALL" all "${FILES_LIST[@]}" "$@"; fi
  rc=$?
  echo "pytest exit $rc (2 after an interrupt, e.g. at SUITE_WALL=${WALL}s)"
else
  # one pytest session per file, each stopped after PER_FILE_WALL seconds, all within SUITE_WALL;
  # extra arguments (e.g. --deselect ID) go to every session
  # PER_FILE_WALL=auto: each file gets an equal share of what is left of SUITE_WALL
  t0=$(date +%s); rc=0; n_left=${#FILES_LIST[@]}
  for f in "${FILES_LIST[@]}"; do
    left=$(( WALL - ($(date +%s) - t0) ))
    if [ "$left" -lt 30 ]; then echo "SUITE_WALL reached: not run: $f"; n_left=$((n_left-1)); continue; fi
    if [ "$PER_FILE_WALL" = auto ]; then wall=$(( left / n_left )); else wall=$(( PER_FILE_WALL < left ? PER_FILE_WALL : left )); fi
    [ "$wall" -ge 30 ] || wall=30
    n_left=$((n_left-1))
    name=$(basename "$f" .py)
    run_pytest "$wall" "$name" "$f" "$@"; r=$?
    echo "$f: pytest exit $r"
    [ "$r" -eq 0 ] || [ "$r" -eq 5 ] || rc=1
  done
fi
"$VENV/bin/python" "$HERE/summarize.py" "$RESULTS" | tee "$RESULTS/summary.md"
exit $rc
