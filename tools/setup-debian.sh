#!/usr/bin/env bash
# Installs every Debian 12 package that shardflow's build, tests, benchmarks and demo need.
set -euo pipefail
packages=(
  # build
  build-essential meson ninja-build pkg-config
  libcurl4-openssl-dev libarchive-dev libturbojpeg0-dev libjpeg62-turbo-dev libspng-dev
  libyaml-dev zlib1g-dev libzstd-dev libmimalloc-dev libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libsodium-dev libssl-dev libxml2-dev libdlpack-dev
  libzip-dev libjansson-dev                   # .npz fields, json validation (decode)
  libwebp-dev libtiff-dev libgif-dev libopenjp2-7-dev libavif-dev libjxl-dev  # .webp .tif .gif .jp2 .avif .jxl (decode)
  libmicrohttpd-dev                            # the /metrics endpoint
  libsndfile1-dev libsamplerate0-dev          # the audio plugin
  libsentencepiece-dev g++                     # the tokenize plugin (C++)
  libavformat-dev libavcodec-dev libswscale-dev libswresample-dev libavutil-dev  # the video plugin (FFmpeg 5.1)
  python3-mesonpy python3-venv                 # pyproject.toml: pip install --no-build-isolation .
  # tests: unit framework, sanitizer and fuzzer runtimes, reference implementations, servers
  libcmocka-dev clang libclang-rt-14-dev python3-numpy python3-soundfile python3-pil python3-torch python3-zmq python3-boto3 nginx-light nftables iproute2 zstd tar graphviz
  sentencepiece python3-sentencepiece  # spm_train and the tokenize plugin's reference
  libavif-bin libjxl-tools             # avifenc/avifdec, cjxl/djxl: test_decode's AVIF and JPEG XL inputs and references
  ffmpeg python3-av                    # test_video: test videos made by the CLI, PyAV's decode as the reference
  prometheus python3-prometheus-client  # test_metrics: a real scraper, and a strict text-format parser
  slurmctld slurmd slurm-client munge  # test_slurm: a single-host Slurm runs the examples/slurm job
  # data and benchmarks
  dataset-fashion-mnist hyperfine valgrind linux-perf mate-backgrounds time  # time: bench/abc.sh's CPU row
  libjpeg-turbo-progs                  # tjbench: bench/imagenet.sh's reference
  webp                                 # cwebp/dwebp: bench/webp_avif.sh's images and reference (avifenc/avifdec: libavif-bin)
  libstb-dev libyuv-dev libswscale-dev  # bench/resize_bench: the SIMD resamplers augment's resize was measured against
)
# s3rver and Azurite (tools/s3rver.sh, tools/azurite.sh: the s3:// and az:// tests install them on first use) come
# from the npm registry; keep a node that is already there.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
