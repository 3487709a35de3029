#!/usr/bin/env bash
# The main job: set up, build, turn the real CIFAR-10 images into reference WebDataset shards,
# serve them with nginx on loopback and stream one epoch of graphs/cifar10_train.yaml over HTTP.
#   tools/main-job.sh [--repeat N] [--epochs N]     (default: --repeat 26, 1,300,000 samples)
# Without ../shared/data/cifar10-jpg.tar.zst it runs on Debian's Fashion-MNIST instead.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
repeat=26 epochs=1 port=${SF_PORT:-8750}
while [ $# -gt 0 ]; do
  case "$1" in
    --repeat) repeat=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "main-job: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

tools/setup-debian.sh
# The package as a trainer installs it (pyproject.toml, a release build): libshardflow, the plugins,
# `import shardflow` and the CLI, in build-venv/ (build-wheel/ keeps meson's build: reruns are incremental).
venv=$top/build-venv
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/python" -m pip install --no-build-isolation --no-index --quiet \
  --config-settings=builddir="$top/build-wheel" "$top"
sf=$venv/bin/shardflow
data=$top/data
archive=$top/../shared/data/cifar10-jpg.tar.zst

# write_set NAME SUBDIR REPEAT INPUT PATTERN: shards once per (input, repeat), remembered in a stamp file.
write_set() {
  local dir=$1 subdir=$2 rep=$3 input=$4 pattern=$5
  local stamp="$dir/.written-repeat-$rep"
  if [ ! -f "$stamp" ]; then
    rm -rf "$dir"; mkdir -p "$dir"
    local args=(--repeat "$rep")
    [ -n "$subdir" ] && args+=(--subdir "$subdir")
    echo "main-job: writing $dir (x$rep)" >&2
    "$sf" write "${args[@]}" "$input" "$dir/$pattern"
    touch "$stamp"
  fi
}
last_shard() { printf '%06d' $(( $(ls "$1"/*.tar | wc -l) - 1 )); }

if [ -f "$archive" ]; then
  need_gb=$(( repeat * 50000 * 4608 / 1000000000 + 1 ))
  free_gb=$(df -P -BG "$top" | awk 'NR==2 { sub("G", "", $4); print $4 }')
  if [ "$free_gb" -lt "$need_gb" ]; then
    echo "main-job: the shards need about ${need_gb} GB and only ${free_gb} GB are free; try --repeat 2" >&2
    exit 1
  fi
  write_set "$data/cifar10/train" train "$repeat" "$archive" cifar-train-%06d.tar
  write_set "$data/cifar10/test" test 10 "$archive" cifar-test-%06d.tar
  graph=graphs/cifar10_train.yaml
  urls="http://127.0.0.1:$port/cifar10/train/cifar-train-{000000..$(last_shard "$data/cifar10/train")}.tar"
  expect=$(( repeat * 50000 ))
else
  echo "main-job: $archive not found; running on Debian's Fashion-MNIST" >&2
  fm=/usr/share/datasets/fashion-mnist
  write_set "$data/fashion-mnist/train" "" "$repeat" "idx:$fm/train-images-idx3-ubyte.gz,$fm/train-labels-idx1-ubyte.gz" fmnist-train-%06d.tar
  graph=graphs/fashion_mnist_train.yaml
  urls="http://127.0.0.1:$port/fashion-mnist/train/fmnist-train-{000000..$(last_shard "$data/fashion-mnist/train")}.tar"
  expect=$(( repeat * 60000 ))
fi

run=$(mktemp -d)
trap 'tools/nginx.sh stop "$run"; rm -rf "$run"' EXIT
tools/nginx.sh start "$data" "$port" "$run"
echo "main-job: nginx serves $data on 127.0.0.1:$port; running $graph" >&2
"$sf" run "$graph" --set "shard_source.urls=$urls" --epochs "$epochs" | tee "$run/log"
got=$(grep -o 'Replica Train Samples=[0-9]*' "$run/log" | tail -1 | cut -d= -f2)
if [ "$got" != "$expect" ]; then
  echo "main-job: FAILED: the epoch yielded ${got:-no} samples, expected $expect" >&2
  exit 1
fi
echo "main-job: OK: $got samples per epoch over http://, as expected" >&2
