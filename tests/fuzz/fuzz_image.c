/* Fuzz target for one image decoder of sf_image_decode, in every output mode and depth; built once per format
 * (SF_FUZZ_FORMAT = "jpg", "png", "pnm", "webp", "tif", "gif", "jp2", "avif" or "jxl", set by tests/fuzz/meson.build). */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void decode_all(sf_buffer *buffer, int min_size, bool gif_frames) {
  static const int depths[] = {8, 16, -1};
  for (int d = 0; d < 3; d++)
    for (int mode = SF_IMAGE_RGB; mode <= SF_IMAGE_KEEP; mode++) {
      const sf_image_limits limits = {
          .max_pixels = 1 << 22, .max_scans = 100, .min_size = min_size, .depth = depths[d], .gif_frames = gif_frames};
      sf_tensor image;
      sf_error error;
      if (sf_image_decode(SF_FUZZ_FORMAT, buffer, 0, sf_buffer_size(buffer), (sf_image_mode)mode, &limits, &image,
                          &error) == 0)
        sf_tensor_clear(&image);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  sf_buffer *buffer = sf_buffer_new(size);
  if (!buffer) return 0;
  if (size) memcpy(sf_buffer_data(buffer), data, size);
  decode_all(buffer, 0, false);
  if (strcmp(SF_FUZZ_FORMAT, "jpg") == 0) decode_all(buffer, 8, false); /* the DCT-downscaling path too */
  if (strcmp(SF_FUZZ_FORMAT, "gif") == 0) decode_all(buffer, 0, true);  /* every frame, their disposals */
  sf_buffer_unref(&buffer);
  return 0;
}
