# Sourced by the bench/*.sh scripts (from the repository root, after `cd "$top"`).
# bench_build: the Debian packages, then shardflow built in $build (SF_BUILD, default build-release, set up with
# --buildtype=release when missing); $build becomes an absolute path.
bench_build() {
  tools/setup-debian.sh
  [ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release -Dtests=false >/dev/null
  ninja -C "$build" shardflow >/dev/null
  case $build in /*) ;; *) build=$top/$build ;; esac
}

# bench_page_cache FILE...: puts the shards in the page cache as the first epoch of a run over local shards leaves
# them: drops them from the cache, then reads them once through shardflow's reader. Its mappings ask for
# transparent huge pages, so where the filesystem has large folios (ext4 and xfs on recent kernels) the shards are
# cached as 2 MiB folios, which every later run maps a PMD at a time (0.1 ms for a 10 MB shard, against 1.4 ms
# for the small folios `cat` leaves after an eviction). SF_PAGE_CACHE=cat reads them with `cat` instead: the state
# after another program read them first. Needs $build (bench_build).
bench_page_cache() {
  /usr/bin/python3 - "$@" <<'PY'
import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
  if [ "${SF_PAGE_CACHE:-shardflow}" = cat ]; then
    cat "$@" > /dev/null
    return
  fi
  local list graph
  list=$(mktemp) graph=$(mktemp --suffix .yaml)
  printf '%s\n' "$@" > "$list"
  printf 'stages:\n  - {type: shard_source, urls: "@%s"}\n  - {type: tar_split}\n  - {type: batch, batch_size: 256, partial: true}\n  - {type: device_sink}\n' "$list" > "$graph"
  "$build/shardflow" run "$graph" --quiet --no-summary > /dev/null
  rm -f "$list" "$graph"
}
