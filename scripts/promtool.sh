#!/usr/bin/env bash
# Prints the path of a promtool binary, for checking and unit-testing deploy/prometheus/*.yml.
#
#   bash scripts/promtool.sh          e.g. ~/.cache/specdeck/tools/promtool
#
# In order: the one fetched before into ${SPECDECK_TOOLS:-$HOME/.cache/specdeck/tools}, one on
# PATH, else Debian's `prometheus` package (bookworm: 2.42) fetched without root: `apt-get download`
# into that directory, `dpkg-deb -x`, and only usr/bin/promtool kept. Nothing is installed and no
# service is set up. Exits non-zero with one line on stderr when it cannot get one.
set -euo pipefail
TOOLS="${SPECDECK_TOOLS:-$HOME/.cache/specdeck/tools}"
BIN="$TOOLS/promtool"
fail() { printf 'promtool.sh: error: %s\n' "$*" >&2; exit 1; }
works() { "$1" --version >/dev/null 2>&1; }

if [ -x "$BIN" ] && works "$BIN"; then echo "$BIN"; exit 0; fi
if command -v promtool >/dev/null 2>&1 && works "$(command -v promtool)"; then command -v promtool; exit 0; fi

command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 \
  || fail "no promtool on PATH and no apt-get/dpkg-deb to fetch Debian's prometheus package: put a promtool (Prometheus 2.x) on PATH or at $BIN"
mkdir -p "$TOOLS" 2>/dev/null || fail "cannot create $TOOLS (set SPECDECK_TOOLS to a writable directory)"
WORK="$(mktemp -d "$TOOLS/.fetch.XXXXXX" 2>/dev/null)" || fail "cannot write to $TOOLS (set SPECDECK_TOOLS to a writable directory)"
trap 'rm -rf "$WORK"' EXIT
if ! (cd "$WORK" && apt-get download prometheus) >"$WORK/apt.log" 2>&1 \
   && ! { [ "$(id -u)" = 0 ] && apt-get update -qq >>"$WORK/apt.log" 2>&1 \
          && (cd "$WORK" && apt-get download prometheus) >>"$WORK/apt.log" 2>&1; }; then  # a fresh machine's empty lists
  fail "apt-get download prometheus failed ($(grep -m1 '^E:' "$WORK/apt.log" || tail -n 1 "$WORK/apt.log")); run apt-get update, or put a promtool on PATH"
fi
DEB="$(ls "$WORK"/prometheus_*.deb 2>/dev/null | head -n 1 || true)"
[ -n "$DEB" ] || fail "apt-get download prometheus left no .deb in $WORK"
dpkg-deb -x "$DEB" "$WORK/x" 2>"$WORK/dpkg.log" || fail "dpkg-deb -x $(basename "$DEB") failed: $(tail -n 1 "$WORK/dpkg.log")"
[ -x "$WORK/x/usr/bin/promtool" ] || fail "$(basename "$DEB") holds no usr/bin/promtool"
works "$WORK/x/usr/bin/promtool" || fail "the promtool from $(basename "$DEB") does not run here"
mv -f "$WORK/x/usr/bin/promtool" "$BIN"  # atomic within $TOOLS: a concurrent run sees the old file or the new one
echo "$BIN"
