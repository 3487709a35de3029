/* Fuzz target: the decode stage on one field of fuzzer bytes: images, `cls` labels and .gz members
 * (the first byte chooses the field name; the rest is the member's content). */
#include <stdint.h>
#include <string.h>

#include "harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const names[] = {"cls", "jpg", "png", "ppm", "pgm", "txt", "cls.gz", "png.gz", "ppm.gz", "json"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  static sf_harness *h;
  if (!h) {
    static const char *const options[] = {"max_pixels=4M", "max_field_size=16MiB", "mode=keep", NULL};
    sf_error e;
    if (sf_harness_new(&h, "decode", options, 0, 0, 0, 1, &e) < 0) return 0;
  }
  sf_sample *s = sf_sample_new();
  sf_buffer *b = sf_buffer_new(size - 1);
  if (!s || !b) {
    sf_sample_destroy(&s);
    sf_buffer_unref(&b);
    return 0;
  }
  if (size > 1) memcpy(sf_buffer_data(b), data + 1, size - 1);
  sf_tensor t;
  int64_t n = (int64_t)size - 1;
  sf_tensor_view(&t, SF_DTYPE_UINT8, 1, &n, b, 0);
  sf_sample_add_field(s, names[data[0] % (sizeof names / sizeof names[0])], true, &t);
  sf_item item = {.kind = SF_ITEM_SAMPLE, .u.sample = s};
  sf_harness_push(h, &item);
  sf_harness_run(h, 0);
  while (sf_harness_pop(h, &item) == 0) sf_item_clear(&item);
  return 0;
}
