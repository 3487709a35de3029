#!/usr/bin/env bash
# s3rver (npm registry), a local S3 server that checks SigV4 signatures, for the s3:// tests.
#   tools/s3rver.sh install              installs it (once) under ${SF_CACHE_DIR:-~/.cache/shardflow}/s3rver
#                                        and prints the path of its executable
#   tools/s3rver.sh run DIR PORT [ARGS]  installs it if needed and runs it in the foreground on
#                                        127.0.0.1:PORT with data in DIR (credentials S3RVER/S3RVER)
# The version is pinned; the install lives outside the repository and is shared by every build dir.
set -euo pipefail
version=3.7.1
cache=${SF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/shardflow}/s3rver-$version
bin=$cache/node_modules/.bin/s3rver

install() {
  if [ -x "$bin" ]; then return 0; fi
  command -v npm >/dev/null || { echo "s3rver.sh: npm is missing (apt-get install nodejs npm)" >&2; exit 1; }
  mkdir -p "$cache"
  # Several tests may install at once: one installs, the others wait for it.
  exec 9>"$cache.lock"
  flock 9
  if [ ! -x "$bin" ]; then
    (cd "$cache" && npm install --no-audit --no-fund --loglevel=error --prefix "$cache" "s3rver@$version" >&2)
  fi
  flock -u 9
}

case "${1:-}" in
  install)
    install
    echo "$bin"
    ;;
  run)
    [ $# -ge 3 ] || { echo "usage: tools/s3rver.sh run DIR PORT [ARGS...]" >&2; exit 2; }
    install
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
