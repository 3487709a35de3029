# Sourced by the bench/*.sh scripts (from the repository root, after `cd "$top"`).
# bench_build: the Debian packages, then shardflow built in $build (SF_BUILD, default build-release, set up with
# --buildtype=release when missing); $build becomes an absolute path.
bench_build() {
  tools/setup-debian.sh
  [ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release -Dtests=false >/dev/null
  ninja -C "$build" shardflow >/dev/null
  case $build in /*) ;; *) build=$top/$build ;; esac
}
