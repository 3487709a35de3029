/* Fuzz target: the .npy reader and the .npz reader (libzip + .npy) on fuzzer bytes; the first byte
 * chooses which and the buffer offset (so aligned and misaligned data both run). */
#include <stdint.h>
#include <string.h>

#include "npy.h"
#include "npz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int take(void *opaque, const char *name, sf_tensor *array, sf_error *error) {
  (void)opaque, (void)name, (void)error;
  /* Touch every byte the view claims, so ASan sees a view reaching past its buffer. */
  if (sf_tensor_numel(array) > 0) {
    volatile uint8_t sink = 0;
    const uint8_t *p = sf_tensor_data(array);
    for (size_t i = 0; i < sf_tensor_nbytes(array); i++)
      sink ^= p[i];
  }
  sf_tensor_clear(array);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t shift = data[0] >> 1 & 7;
  sf_buffer *b = sf_buffer_new(size - 1 + shift);
  if (!b) return 0;
  memcpy(sf_buffer_data(b) + shift, data + 1, size - 1);
  sf_error e;
  if (data[0] & 1) {
    sf_npz_read(b, shift, size - 1, 1 << 24, take, NULL, &e);
  } else {
    sf_tensor t;
    if (sf_npy_read(b, shift, size - 1, &t, &e) == 0) take(NULL, "", &t, &e);
  }
  sf_buffer_unref(&b);
  return 0;
}
