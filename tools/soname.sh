#!/bin/sh
# tools/soname.sh LIBDIR NAME: the soname of LIBDIR/libNAME.so (what the linker would record), for the
# libraries the engine opens on first use (engine/core/dynlib.h) instead of linking.
set -eu
objdump -p "$1/lib$2.so" | awk '$1 == "SONAME" { print $2; found = 1 } END { exit !found }'
