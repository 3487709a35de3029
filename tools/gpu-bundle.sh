#!/usr/bin/env bash
# Prepares what tests/gpu/run.sh needs on a GPU machine that cannot build shardflow itself (the device
# machines lent here have CUDA, PyTorch, JAX, meson and ninja, but not the C libraries' -dev packages, and
# reach no network): run it here, on an x86-64 Debian with tools/setup-debian.sh's packages, then carry
# .gpu (ignored by .gitignore) to the GPU machine and run tests/gpu/run.sh there.
#   tools/gpu-bundle.sh        writes .gpu/bundle.tar.gz and .gpu/cifar10-jpg.tar.zst
# The bundle: a release build (build-gpu, or SF_BUILD) of the shardflow CLI, libshardflow.so and the device
# pool's unit test, and every shared library they load except the C runtime's own (glibc, libstdc++,
# libgcc_s: the GPU machine's are newer, which runs them). About 25 MiB with the data: under the 64 MiB a
# call carries.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
build=${SF_BUILD:-build-gpu}
[ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release -Dexamples=false -Dfuzzing=disabled >/dev/null
ninja -C "$build" shardflow libshardflow.so.0.1.0 tests/test_device tests/fake_cuda.so >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/lib" .gpu
cp "$build/shardflow" "$stage/"
cp "$build/libshardflow.so.0.1.0" "$stage/libshardflow.so"
cp "$build/tests/test_device" "$stage/tests/"
cp "$build/tests/fake_cuda.so" "$stage/tests/"
# The libraries they load, but the C runtime's (the loader, libc, libm, libpthread, libdl, librt, libgcc_s,
# libstdc++): those must be the machine's own.
for binary in "$stage/shardflow" "$stage/libshardflow.so" "$stage/tests/test_device"; do
  ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | grep -vE '/(ld-linux[^/]*|libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
tar czf .gpu/bundle.tar.gz -C "$stage" .
src=$top/../shared/data/cifar10-jpg.tar.zst
[ -f "$src" ] && cp "$src" .gpu/
du -sh .gpu/*
echo "carry .gpu and run tests/gpu/run.sh on the GPU machine"
