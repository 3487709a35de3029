#!/usr/bin/env bash
# The GPU checks of device_sink's device: cuda (issue 29), in one go, on a machine with an NVIDIA GPU, its
# driver, PyTorch built for CUDA and (optionally) JAX with its CUDA backend; no network needed.
#   tests/gpu/run.sh [--dry-run]
# The build: with .gpu/bundle.tar.gz (tools/gpu-bundle.sh, run on a machine that can build shardflow, and .gpu
# carried here), its release build and libraries; else SF_BUILD's build directory if it has one; else a
# release build here in build-gpu (which needs tools/setup-debian.sh's packages). The data: the CIFAR-10
# shards written once into data/gpu (as bench/cifar.sh does) from ../shared/data/cifar10-jpg.tar.zst, or
# .gpu/cifar10-jpg.tar.zst. Then the device pool's unit test and tests/gpu/test_gpu.py (what each check does is
# written at its top), and a PASS/FAIL summary. The whole log also goes to $OUT/gpu-run.log when OUT is set.
# PYTHON names the interpreter (default: the first of python3, /usr/bin/python3 whose torch sees a GPU).
# --dry-run checks the script on a machine without a GPU: the build, the data and the CPU half of the
# comparisons. About 2 minutes with a bundle on a 16-core H100 host (a build there adds about 2).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
dry=""
[ "${1:-}" = "--dry-run" ] && dry=--dry-run
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  exec > >(tee "$OUT/gpu-run.log") 2>&1
fi
build=${SF_BUILD:-build-gpu}
case $build in /*) ;; *) build=$top/$build ;; esac
summary=()
fail() { echo "FAIL $1"; summary+=("FAIL $1"); }
finish() {
  echo
  echo "==== summary ($(date -u '+%F %T') UTC, $(hostname)) ===="
  printf '%s\n' "${summary[@]}"
  if printf '%s\n' "${summary[@]}" | grep -q '^FAIL'; then echo "RESULT: FAIL"; exit 1; fi
  echo "RESULT: PASS"
  exit 0
}
export TMPDIR=${TMPDIR:-/tmp}
export XLA_PYTHON_CLIENT_PREALLOCATE=false # JAX would take 75% of the GPU at import: the leak check reads it

echo "==== machine ===="
if [ -z "$dry" ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv || fail "nvidia-smi: no GPU or driver"
fi
nproc

bundle=$top/.gpu/bundle.tar.gz
if [ -f "$bundle" ] && [ -z "${SF_BUILD:-}" ]; then
  build=$TMPDIR/sf-gpu-bundle
  echo "==== build: $bundle (tools/gpu-bundle.sh) ===="
  rm -rf "$build"
  mkdir -p "$build"
  tar xzf "$bundle" -C "$build" || fail "unpacking $bundle"
  export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "libraries carried: $(cd "$build/lib" && echo *)"
elif command -v meson >/dev/null && command -v ninja >/dev/null; then
  echo "==== build ($build) ===="
  if [ ! -f "$build/build.ninja" ]; then # the unit tests need cmocka: without it, the library and CLI alone
    meson setup "$build" --buildtype=release -Dexamples=false -Dfuzzing=disabled >/dev/null ||
      meson setup --wipe "$build" --buildtype=release -Dexamples=false -Dfuzzing=disabled -Dtests=false >/dev/null ||
      fail "meson setup (the C libraries of tools/setup-debian.sh are missing here? run tools/gpu-bundle.sh where they are, and carry .gpu)"
  fi
  if [ -f "$build/build.ninja" ]; then
    ninja -C "$build" >/dev/null || fail "ninja"
  fi
elif [ -f "$build/libshardflow.so" ]; then
  echo "no meson/ninja here: using the build already in $build"
else
  fail "no bundle (.gpu/bundle.tar.gz), no meson/ninja and no build in $build"
fi
if ! { [ -x "$build/shardflow" ] && [ -f "$build/libshardflow.so" ]; }; then
  fail "the build has no shardflow CLI and library"
  finish
fi
"$build/shardflow" --version || fail "the shardflow CLI does not run here (a library missing?)"
export SHARDFLOW_LIB=$build/libshardflow.so PYTHONPATH=$top/python${PYTHONPATH:+:$PYTHONPATH}

echo "==== the device pool against a fake driver (unit test) ===="
if [ -x "$build/tests/test_device" ]; then
  if "$build/tests/test_device" >/dev/null 2>&1; then summary+=("PASS unit test_device"); else fail "unit test_device"; fi
fi

echo "==== data ===="
shards=${SF_GPU_DATA:-$top/data/gpu}
src=$top/../shared/data/cifar10-jpg.tar.zst
[ -f "$src" ] || src=$top/.gpu/cifar10-jpg.tar.zst
if [ ! -f "$shards/.done" ]; then
  [ -f "$src" ] || { fail "no CIFAR-10 (../shared/data/cifar10-jpg.tar.zst or .gpu/cifar10-jpg.tar.zst)"; finish; }
  rm -rf "$shards"
  mkdir -p "$shards"
  "$build/shardflow" write --quiet --subdir train "$src" "$shards/cifar-train-%06d.tar" || { fail "shardflow write"; finish; }
  touch "$shards/.done"
fi
n=$(find "$shards" -name 'cifar-train-*.tar' | wc -l)
[ "$n" -gt 0 ] || { fail "no shards in $shards"; finish; }
pattern="$shards/cifar-train-{000000..$(printf '%06d' $((n - 1)))}.tar"
echo "$n shards: $pattern"
cat "$shards"/*.tar >/dev/null # the page cache: the pipeline's pace is then the CPU's

echo "==== python ===="
py=${PYTHON:-}
if [ -z "$py" ]; then
  for candidate in python3 /usr/bin/python3; do
    command -v "$candidate" >/dev/null || continue
    if [ -n "$dry" ] && "$candidate" -c 'import numpy, torch' 2>/dev/null; then py=$candidate; break; fi
    if "$candidate" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      py=$candidate
      break
    fi
  done
fi
[ -n "$py" ] || { fail "no Python whose PyTorch sees a GPU (set PYTHON)"; finish; }
echo "$py: $("$py" --version 2>&1)"

echo "==== GPU checks (tests/gpu/test_gpu.py) ===="
log=$TMPDIR/sf-gpu-checks.$$.log
status=0
read -r -a extra <<< "${SF_GPU_ARGS:-} $dry" # SF_GPU_ARGS: e.g. "--only overlap" or "--batches 100"
timeout 420 "$py" "$top/tests/gpu/test_gpu.py" --shards "$pattern" --shardflow "$build/shardflow" "${extra[@]}" \
  2>&1 | tee "$log" || status=$?
while IFS= read -r line; do summary+=("$line"); done < <(grep -E '^(PASS|FAIL|SKIP|INFO) ' "$log" | cut -c1-240)
if [ "$status" -ne 0 ] && ! grep -q '^FAIL ' "$log"; then fail "test_gpu.py exited $status (124: over its 7 minutes)"; fi
rm -f "$log"
finish
