#!/usr/bin/env bash
# Starts or stops a loopback nginx that serves a directory (shards) for the main job and benchmarks.
#   tools/nginx.sh start ROOT PORT RUNDIR   |   tools/nginx.sh stop RUNDIR
set -euo pipefail
cmd=${1:?start or stop}
if [ "$cmd" = start ]; then
  root=$(realpath "${2:?root}") port=${3:?port} run=$(mkdir -p "${4:?rundir}" && realpath "$4")
  user_line=""
  [ "$(id -u)" -eq 0 ] && user_line="user root;"
  cat > "$run/nginx.conf" <<CONF
$user_line
worker_processes 1;
pid $run/nginx.pid;
error_log $run/error.log warn;
events { worker_connections 256; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  client_body_temp_path $run/body;
  proxy_temp_path $run/proxy;
  fastcgi_temp_path $run/fastcgi;
  uwsgi_temp_path $run/uwsgi;
  scgi_temp_path $run/scgi;
  types { application/x-tar tar; }
  server {
    listen 127.0.0.1:$port;
    root $root;
    # checkpoints: uploads by shardflow cp (PUT to a temporary name, MOVE into place)
    location /checkpoints/ { dav_methods PUT DELETE MOVE; create_full_put_path on; client_max_body_size 0; }
  }
}
CONF
  if ! /usr/sbin/nginx -c "$run/nginx.conf" -p "$run" 2>"$run/start.log"; then
    echo "nginx could not start on 127.0.0.1:$port:" >&2
    cat "$run/start.log" >&2
    echo "(is the port taken? choose another with SF_PORT=...)" >&2
    exit 1
  fi
  for _ in $(seq 50); do
    [ -s "$run/nginx.pid" ] && exit 0
    sleep 0.1
  done
  echo "nginx did not write its pid file" >&2
  exit 1
elif [ "$cmd" = stop ]; then
  run=${2:?rundir}
  if [ -s "$run/nginx.pid" ]; then
    kill "$(cat "$run/nginx.pid")" 2>/dev/null || true
    rm -f "$run/nginx.pid"
  fi
fi
