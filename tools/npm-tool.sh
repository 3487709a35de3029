#!/usr/bin/env bash
# A pinned npm registry package installed once, outside the repository, for the tests' local servers
# (tools/s3rver.sh, tools/azurite.sh):
#   tools/npm-tool.sh install PACKAGE VERSION BIN   installs PACKAGE@VERSION (once) under
#                                                   ${SF_CACHE_DIR:-~/.cache/shardflow}/PACKAGE-VERSION
#                                                   and prints the path of its executable BIN
set -euo pipefail
[ "${1:-}" = install ] && [ $# -eq 4 ] || { echo "usage: tools/npm-tool.sh install PACKAGE VERSION BIN" >&2; exit 2; }
package=$2 version=$3
cache=${SF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/shardflow}/$package-$version
bin=$cache/node_modules/.bin/$4
if [ ! -x "$bin" ]; then
  command -v npm >/dev/null || { echo "npm-tool.sh: npm is missing (apt-get install nodejs npm)" >&2; exit 1; }
  mkdir -p "$cache"
  # Several tests may install at once: one installs, the others wait for it.
  exec 9>"$cache.lock"
  flock 9
  if [ ! -x "$bin" ]; then
    (cd "$cache" && npm install --no-audit --no-fund --loglevel=error --prefix "$cache" "$package@$version" >&2)
  fi
  flock -u 9
fi
echo "$bin"
