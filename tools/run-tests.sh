#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite; ends with "N passed, N failed".
#   tools/run-tests.sh            the suite twice, as CI runs it: normal build (build-test/),
#                                 then AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)
#   tools/run-tests.sh --normal   the normal build only
#   tools/run-tests.sh --asan     ASan + UBSan only
#   tools/run-tests.sh --tsan     ThreadSanitizer only (build-tsan/; the CLI without mimalloc)
#   extra arguments after -- go to `meson test` (e.g. -- --suite unit, or test names)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
passes=(normal asan)
case "${1:-}" in
  --normal) passes=(normal); shift ;;
  --asan) passes=(asan); shift ;;
  --tsan) passes=(tsan); shift ;;
esac
[ "${1:-}" = "--" ] && shift
tools/setup-debian.sh || { echo "0 passed, 1 failed"; exit 1; }

# The tests' temporary files (shards, servers' roots, logs) go into one directory removed at the end, so a
# test that fails before its own cleanup leaves nothing behind in /tmp (SF_KEEP_TMP=1 keeps it for a look).
export TMPDIR
TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/sf-tests.XXXXXX")
chmod 755 "$TMPDIR" # daemons the tests start as their own users (munged) must reach their directories in it
[ -n "${SF_KEEP_TMP:-}" ] && echo "temporary files kept in $TMPDIR" || trap 'rm -rf "$TMPDIR"' EXIT

total_passed=0 total_failed=0
# Runs one pass; adds its counts to the totals.
run_pass() {
  local pass=$1; shift
  local dir=build-test opts=()
  case $pass in
    asan) dir=build-asan opts=(-Db_sanitize=address,undefined -Db_lundef=false) ;;
    tsan) dir=build-tsan opts=(-Db_sanitize=thread -Dmimalloc=disabled) ;;
  esac
  echo "== $pass: $dir"
  if [ ! -f "$dir/build.ninja" ]; then
    if ! meson setup "$dir" "${opts[@]}" >/dev/null; then
      echo "meson setup failed"; total_failed=$((total_failed + 1)); return
    fi
  fi
  if ! ninja -C "$dir" >"$dir/build.log" 2>&1; then
    tail -40 "$dir/build.log"; total_failed=$((total_failed + 1)); return
  fi
  (
    # libzmq/libsodium are not instrumented for TSan: ignore their accesses (else every CURVE frame is a suppressed report, slowly)
    [ "$pass" = tsan ] && export TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1 suppressions=$top/tests/tsan.supp"
    meson test -C "$dir" --print-errorlogs --num-processes "$(nproc)" "$@"
  )
  local status=$? counts
  counts=$(/usr/bin/python3 - "$dir/meson-logs/testlog.json" <<'PY'
import json, sys
passed = failed = 0
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    if r in ("OK", "EXPECTEDFAIL"):
        passed += 1
    elif r != "SKIP":
        failed += 1
print(passed, failed)
PY
  ) || counts="0 1"
  set -- $counts
  # meson failing with no failed test counted (a crash of the runner itself) is still a failure
  [ "$status" -ne 0 ] && [ "$2" -eq 0 ] && set -- "$1" 1
  echo "$pass: $1 passed, $2 failed"
  total_passed=$((total_passed + $1)) total_failed=$((total_failed + $2))
}
for pass in "${passes[@]}"; do
  run_pass "$pass" "$@"
done
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
