#!/usr/bin/env bash
# s3rver (npm registry), a local S3 server that checks SigV4 signatures, for the s3:// tests.
#   tools/s3rver.sh install              installs it (once) under ${SF_CACHE_DIR:-~/.cache/shardflow}/s3rver-VERSION
#                                        and prints the path of its executable
#   tools/s3rver.sh run DIR PORT [ARGS]  installs it if needed and runs it in the foreground on
#                                        127.0.0.1:PORT with data in DIR (credentials S3RVER/S3RVER)
# The version is pinned; the install lives outside the repository and is shared by every build dir.
set -euo pipefail
install() { "$(dirname "$0")/npm-tool.sh" install s3rver 3.7.1 s3rver; }

case "${1:-}" in
  install)
    install
    ;;
  run)
    [ $# -ge 3 ] || { echo "usage: tools/s3rver.sh run DIR PORT [ARGS...]" >&2; exit 2; }
    bin=$(install)
    dir=$2 port=$3
    shift 3
    # s3rver encrypts continuation tokens with DES, which OpenSSL 3 keeps in its legacy provider.
    export NODE_OPTIONS="${NODE_OPTIONS:+$NODE_OPTIONS }--openssl-legacy-provider"
    exec "$bin" --silent --address 127.0.0.1 --port "$port" --directory "$dir" "$@"
    ;;
  *)
    echo "usage: tools/s3rver.sh install | run DIR PORT [ARGS...]" >&2
    exit 2
    ;;
esac
