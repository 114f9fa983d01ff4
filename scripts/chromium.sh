#!/usr/bin/env bash
# Prints the path of a Chromium for the page's browser tests (tests/test_ui.py, driven by Playwright
# for Python with this executable; never `playwright install`, which downloads a browser). Uses one
# that is installed; else, as root where apt-get exists, installs Debian's `chromium` package.
set -euo pipefail
for c in chromium chromium-browser; do
  if command -v "$c" >/dev/null 2>&1; then command -v "$c"; exit 0; fi
done
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium.sh: no chromium here, and apt-get needs root: install Debian's chromium package" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq chromium >/dev/null 2>&1; then
  apt-get update -qq >/dev/null 2>&1 || true
  apt-get install -y -qq chromium >/dev/null 2>&1 || { echo "chromium.sh: apt-get install chromium failed" >&2; exit 1; }
fi
command -v chromium
