/* Fuzz target: the shard index reader (engine/io/shard_index.c) on fuzzer bytes; an index it accepts must hold
 * spans that a reader may trust: ascending, each at least a header long, inside the size it records. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "shard_index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  FILE *f = fmemopen((void *)data, size, "r");
  if (!f) return 0;
  sf_shard_index index;
  sf_error e;
  if (sf_shard_index_read_stream(&index, f, "fuzz.sfidx", &e) == 0) {
    for (size_t i = 0; i < index.count; i++)
      if (index.offsets[i + 1] - index.offsets[i] < 512 || index.offsets[i + 1] > index.size || !index.keys[i])
        abort(); /* a span the reader should have refused */
    sf_shard_index_clear(&index);
  }
  fclose(f);
  return 0;
}
