/* Fuzz target: scan entries (engine/codec/jpeg_scan.c) on fuzzer bytes. A header sf_jpeg_scan_open accepts is walked
 * to its last row; entries it finds must lie inside the scan and move forward; each row's stand-in head must be
 * written or refused. Then the differential check: region decodes starting at kept entries (a first pass walks, a
 * second starts where it kept them) must return what libjpeg's own skipping returns, the same pixels or the same
 * error code. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jpeg_entries.h"
#include "jpeg_region.h"
#include "jpeg_scan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk_and_resume(const uint8_t *data, size_t size) {
  sf_jpeg_scan s;
  if (!sf_jpeg_scan_open(&s, data, size) || s.rows < 2 || s.rows > 4096) return;
  sf_jpeg_entry *e = malloc((size_t)s.rows * sizeof *e);
  if (!e) return;
  e[0] = sf_jpeg_scan_first(&s);
  int rows = 1;
  if (sf_jpeg_scan_walk(&s, &e[0], 0, s.rows - 1, e + 1) == 0) rows = s.rows;
  for (int r = 1; r < rows; r++) {
    if (e[r].byte < s.scan_start || e[r].byte >= size || e[r].bit > 7 || e[r].byte < e[r - 1].byte) abort();
    uint8_t *head = NULL;
    size_t head_size = 0, resume = 0;
    if (sf_jpeg_scan_resume(&s, &e[r], r, &head, &head_size, &resume) == 0 && (resume > size || !head)) abort();
    free(head);
  }
  free(e);
}

/* Region rect of src decoded with entries on or off: its code, and its rows (NULL on an error). */
static int region(const sf_jpeg_source *src, const int64_t rect[4], bool entries, sf_tensor *out) {
  sf_jpeg_entries_enable(entries);
  int64_t x0;
  sf_error error;
  int rc = sf_jpeg_decode_region(src, 8, false, rect, out, &x0, &error);
  sf_jpeg_entries_enable(true);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  walk_and_resume(data, size);
  sf_tensor bytes;
  if (size < 4 || sf_tensor_alloc(&bytes, SF_DTYPE_UINT8, 1, (int64_t[]){(int64_t)size}) < 0) return 0;
  memcpy(sf_tensor_data(&bytes), data, size);
  const sf_image_limits limits = {.max_pixels = 1 << 20, .depth = 8};
  sf_jpeg_source src;
  if (sf_jpeg_probe(&bytes, SF_IMAGE_RGB, &limits, &src)) {
    sf_jpeg_entries_reset(1 << 20);
    for (int pass = 0; pass < 2; pass++)
      for (int64_t top = src.height / 3; top < src.height; top += src.height / 3 + 1) {
        const int64_t rect[4] = {top, 0, src.height, src.width};
        sf_tensor plain, resumed;
        const int a = region(&src, rect, false, &plain), b = region(&src, rect, true, &resumed);
        if (a != b) abort();
        if (a == 0 && (plain.shape[1] != resumed.shape[1] ||
                       memcmp(sf_tensor_data(&plain), sf_tensor_data(&resumed), sf_tensor_nbytes(&plain)) != 0))
          abort();
        if (a == 0) sf_tensor_clear(&plain), sf_tensor_clear(&resumed);
      }
    sf_tensor_clear(&src.bytes);
  }
  sf_tensor_clear(&bytes);
  return 0;
}
