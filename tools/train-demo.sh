#!/usr/bin/env bash
# The reference training run (issue 4): ResNet-8 on the main job's CIFAR-10 shards over nginx, two
# data-parallel processes, killed in the middle of an epoch and resumed from its checkpoint in
# object storage. Needs the main job's shards (tools/main-job.sh). Log: data/train-demo.log.
#   tools/train-demo.sh [--epochs N] [--interrupt-at EPOCH STEP]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
epochs=8 ie=5 is=100 port=${SF_PORT:-8750}
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --interrupt-at) ie=$2 is=$3; shift 3 ;;
    *) echo "train-demo: unknown argument $1" >&2; exit 2 ;;
  esac
done
tools/setup-debian.sh
[ -f build-release/build.ninja ] || meson setup build-release --buildtype=release -Dtests=false >/dev/null
ninja -C build-release >/dev/null
[ -f data/cifar10/train/.written-repeat-26 ] || { echo "train-demo: run tools/main-job.sh first" >&2; exit 1; }
export SHARDFLOW_LIB=$top/build-release/libshardflow.so
run=$(mktemp -d)
trap 'tools/nginx.sh stop "$run"; rm -rf "$run"' EXIT
tools/nginx.sh start data "$port" "$run"
log=data/train-demo.log
ckpt=http://127.0.0.1:$port/checkpoints/resnet8-cifar10.pt
args=(--shards "http://127.0.0.1:$port/cifar10" --checkpoint-url "$ckpt" --epochs "$epochs")
echo "train-demo: training, interrupted at epoch $ie step $is" | tee "$log"
/usr/bin/python3 examples/train_cifar10.py "${args[@]}" --interrupt-at "$ie" "$is" 2>&1 | tee -a "$log" || true
echo "train-demo: resuming from $ckpt" | tee -a "$log"
/usr/bin/python3 examples/train_cifar10.py "${args[@]}" --load-checkpoint "$ckpt" 2>&1 | tee -a "$log"
