#!/usr/bin/env bash
# What augment's `exact: false` does to pixels and to a model's accuracy, on real photographs: CIFAR-10 stored as
# the JPEGs of ../shared/data/cifar10-jpg.tar.zst (the bytes as they are, --format orig), fed by the reference
# workload's augmentation (random crop 32 with padding 4, flip, normalised float32 CHW), so that every JPEG goes
# through augment's region decode. Two measurements (bench/exact_accuracy.py):
# - pixels: the same samples (same seed, so the same crops and flips) through augment with exact: true and
#   exact: false as uint8: the mean and largest absolute difference and the share of values that differ;
# - accuracy: the README's ResNet-8 (examples/train_cifar10.py's model, its optimiser and one-cycle schedule)
#   trained for --epochs on each, --seeds seeds each (the same seed gives both the same initial weights and
#   the same sample order), each model scored on the 10,000 test images decoded both ways.
# --size S (default 32): the output side; under 32 augment first resizes the 32 x 32 images (shorter side to S,
# PIL's antialiased bilinear), which exact: false does by DCT scaling (S = 16: decoded at 1/2 scale), and the
# random crop pads S / 8.
#   bench/exact_accuracy.sh [--epochs N] [--seeds N] [--threads N] [--size S]
# About 50 s of 2 cores per epoch and model with the defaults (2 seeds x 2 settings x 10 epochs: 33 min; --size 16: 4x less).
# SF_BUILD names the build directory (default build-release).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
epochs=10 seeds=2 size=32 threads=$(nproc) build=${SF_BUILD:-build-release}
while [ $# -gt 0 ]; do
  case $1 in
    --epochs) epochs=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    *) echo "usage: bench/exact_accuracy.sh [--epochs N] [--seeds N] [--threads N] [--size S]" >&2; exit 2 ;;
  esac
done
. bench/lib.sh
bench_build
shards=$top/data/bench/cifar10-jpeg
if [ ! -f "$shards/.done" ]; then
  rm -rf "$shards"; mkdir -p "$shards"
  for part in train test; do
    "$build/shardflow" write --quiet --format orig --subdir "$part" "$top/../shared/data/cifar10-jpg.tar.zst" \
      "$shards/cifar-$part-%06d.tar"
  done
  touch "$shards/.done"
fi
SHARDFLOW_LIB=$build/libshardflow.so /usr/bin/python3 bench/exact_accuracy.py --shards "$shards" \
  --epochs "$epochs" --seeds "$seeds" --threads "$threads" --size "$size"
