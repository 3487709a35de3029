#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite; ends with "N passed, N failed".
#   tools/run-tests.sh            normal build (build-test/)
#   tools/run-tests.sh --asan     AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   tools/run-tests.sh --tsan     ThreadSanitizer (build-tsan/; the CLI without mimalloc)
#   extra arguments after -- go to `meson test` (e.g. -- --suite unit)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
dir=build-test opts=()
if [ "${1:-}" = "--asan" ]; then
  dir=build-asan opts=(-Db_sanitize=address,undefined -Db_lundef=false)
  shift
elif [ "${1:-}" = "--tsan" ]; then
  dir=build-tsan opts=(-Db_sanitize=thread -Dmimalloc=disabled)
  # libzmq/libsodium are not instrumented: ignore their accesses (else every CURVE frame is a suppressed report, slowly)
  export TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 suppressions=$PWD/tests/tsan.supp"
  shift
fi
[ "${1:-}" = "--" ] && shift
tools/setup-debian.sh || { echo "0 passed, 1 failed"; exit 1; }
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" "${opts[@]}" >/dev/null || { echo "meson setup failed"; echo "0 passed, 1 failed"; exit 1; }
fi
if ! ninja -C "$dir" >"$dir/build.log" 2>&1; then
  tail -40 "$dir/build.log"
  echo "0 passed, 1 failed"
  exit 1
fi
meson test -C "$dir" --print-errorlogs --num-processes "$(nproc)" "$@"
status=$?
/usr/bin/python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
passed = failed = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"):
        passed += 1
    elif r != "SKIP":
        failed += 1
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
PY
summary=$?
[ $status -eq 0 ] && [ $summary -eq 0 ]
