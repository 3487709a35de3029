/* Fuzz target: arbitrary bytes through the tar reader (gzip, zstd, libarchive's tar) and WebDataset's key grouping. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tar_reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  sf_tar_reader *tar = NULL;
  sf_error error;
  if (sf_tar_reader_open_memory(&tar, data, size, "fuzz.tar", &error) < 0) return 0;
  /* Every sample a reader returns must be well formed; a bound keeps hostile inputs finite. */
  for (int i = 0; i < 100000; i++) {
    sf_sample *sample = NULL;
    int rc = sf_tar_reader_next(tar, &sample, &error);
    bool goes_on = rc == 0 || sample; /* an error with a sample spoils that sample only */
    if (sample) {
      for (int f = 0; f < sample->n_fields; f++) {
        const sf_tensor *t = &sample->fields[f].tensor;
        /* Touch the first and last byte so ASan sees any out-of-bounds field. */
        if (t->shape[0] > 0) {
          volatile uint8_t first = ((const uint8_t *)sf_tensor_data(t))[0];
          volatile uint8_t last = ((const uint8_t *)sf_tensor_data(t))[t->shape[0] - 1];
          (void)first;
          (void)last;
        }
      }
      sf_sample_destroy(&sample);
    }
    if (!goes_on) break;
  }
  sf_tar_reader_close(&tar);
  return 0;
}
