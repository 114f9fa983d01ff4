#!/usr/bin/env bash
# Prints the path of one binary from a Debian package, fetched without root and cached: the test
# suite's real promtool and nginx (scripts/promtool.sh, scripts/nginx.sh call this).
#
#   bash scripts/debian-tool.sh PACKAGE PATH-IN-PACKAGE VERSION-FLAG
#   bash scripts/debian-tool.sh nginx usr/sbin/nginx -v      e.g. ~/.cache/specdeck/tools/nginx
#
# In order: the one fetched before into ${SPECDECK_TOOLS:-$HOME/.cache/specdeck/tools}, one on
# PATH, else the package fetched with `apt-get download` into that directory, `dpkg-deb -x`, and
# only that binary kept. Nothing is installed and no service is set up. A binary counts only if
# `BINARY VERSION-FLAG` runs. Exits non-zero with one line on stderr when it cannot get one.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: debian-tool.sh PACKAGE PATH-IN-PACKAGE VERSION-FLAG" >&2; exit 2; }
PKG="$1" INNER="$2" FLAG="$3"
NAME="$(basename "$INNER")"
TOOLS="${SPECDECK_TOOLS:-$HOME/.cache/specdeck/tools}"
BIN="$TOOLS/$NAME"
fail() { printf '%s: error: %s\n' "$NAME" "$*" >&2; exit 1; }
works() { "$1" "$FLAG" >/dev/null 2>&1; }

if [ -x "$BIN" ] && works "$BIN"; then echo "$BIN"; exit 0; fi
if command -v "$NAME" >/dev/null 2>&1 && works "$(command -v "$NAME")"; then command -v "$NAME"; exit 0; fi
for dir in /usr/sbin /sbin; do  # not on a user's PATH on Debian
  if [ -x "$dir/$NAME" ] && works "$dir/$NAME"; then echo "$dir/$NAME"; exit 0; fi
done

command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 \
  || fail "no $NAME on PATH and no apt-get/dpkg-deb to fetch Debian's $PKG package: put one on PATH or at $BIN"
mkdir -p "$TOOLS" 2>/dev/null || fail "cannot create $TOOLS (set SPECDECK_TOOLS to a writable directory)"
WORK="$(mktemp -d "$TOOLS/.fetch.XXXXXX" 2>/dev/null)" || fail "cannot write to $TOOLS (set SPECDECK_TOOLS to a writable directory)"
trap 'rm -rf "$WORK"' EXIT
if ! (cd "$WORK" && apt-get download "$PKG") >"$WORK/apt.log" 2>&1 \
   && ! { [ "$(id -u)" = 0 ] && apt-get update -qq >>"$WORK/apt.log" 2>&1 \
          && (cd "$WORK" && apt-get download "$PKG") >>"$WORK/apt.log" 2>&1; }; then  # a fresh machine's empty lists
  fail "apt-get download $PKG failed ($(grep -m1 '^E:' "$WORK/apt.log" || tail -n 1 "$WORK/apt.log")); run apt-get update, or put a $NAME on PATH"
fi
DEB="$(ls "$WORK/${PKG}"_*.deb 2>/dev/null | head -n 1 || true)"
[ -n "$DEB" ] || fail "apt-get download $PKG left no .deb in $WORK"
dpkg-deb -x "$DEB" "$WORK/x" 2>"$WORK/dpkg.log" || fail "dpkg-deb -x $(basename "$DEB") failed: $(tail -n 1 "$WORK/dpkg.log")"
[ -x "$WORK/x/$INNER" ] || fail "$(basename "$DEB") holds no $INNER"
works "$WORK/x/$INNER" || fail "the $NAME from $(basename "$DEB") does not run here"
mv -f "$WORK/x/$INNER" "$BIN"  # atomic within $TOOLS: a concurrent run sees the old file or the new one
echo "$BIN"
