#!/usr/bin/env bash
# Prints the path of a promtool binary, for checking and unit-testing deploy/prometheus/*.yml:
# Debian's `prometheus` package's (bookworm: 2.42), fetched without root and cached (see
# scripts/debian-tool.sh), unless one is on PATH.
exec bash "$(dirname "$0")/debian-tool.sh" prometheus usr/bin/promtool --version
