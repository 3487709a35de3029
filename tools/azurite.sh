#!/usr/bin/env bash
# Azurite's Blob service (npm registry), Microsoft's local Azure Storage emulator, for the az:// tests.
#   tools/azurite.sh install              installs it (once) under ${SF_CACHE_DIR:-~/.cache/shardflow}/azurite-VERSION
#                                         and prints the path of its executable
#   tools/azurite.sh run DIR PORT [ARGS]  installs it if needed and runs the Blob service in the foreground on
#                                         127.0.0.1:PORT with data in DIR; the account is devstoreaccount1 with
#                                         its well-known key, at http://127.0.0.1:PORT/devstoreaccount1
# The version is pinned (3.35.0: the last that runs on Debian 12's node 18/20); the install is shared by every
# build dir.
set -euo pipefail
install() { "$(dirname "$0")/npm-tool.sh" install azurite 3.35.0 azurite-blob; }

case "${1:-}" in
  install)
    install
    ;;
  run)
    [ $# -ge 3 ] || { echo "usage: tools/azurite.sh run DIR PORT [ARGS...]" >&2; exit 2; }
    bin=$(install)
    dir=$2 port=$3
    shift 3
    exec "$bin" --silent --disableTelemetry --blobHost 127.0.0.1 --blobPort "$port" --location "$dir" "$@"
    ;;
  *)
    echo "usage: tools/azurite.sh install | run DIR PORT [ARGS...]" >&2
    exit 2
    ;;
esac
