#!/usr/bin/env bash
# Prints the path of an nginx binary, for the tests that run deploy/nginx/*.conf on loopback:
# Debian's `nginx` package's (bookworm: 1.22), fetched without root and cached (see
# scripts/debian-tool.sh), unless one is installed.
exec bash "$(dirname "$0")/debian-tool.sh" nginx usr/sbin/nginx -v
