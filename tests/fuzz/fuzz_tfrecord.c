/* Fuzz target: arbitrary bytes through the TFRecord reader (framing, CRC32C, gzip/zstd) and tf.train.Example parsing. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tar_reader.h"
#include "tfrecord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * The first byte picks the mode. Bit 0 clear: the rest is the shard as stored. Bit 0 set: the rest is
 * framed as one record with good CRCs and followed by itself unframed, so the fuzzer reaches the
 * Example parser instead of stopping at the CRC. Bit 1 keys samples by feature "label", bit 2 renames
 * "image/encoded" to "jpg".
 */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t mode = data[0];
  data++, size--;
  uint8_t *shard = NULL;
  size_t n = size;
  if (mode & 1) {
    if (!(shard = malloc(2 * size + SF_TFRECORD_HEADER + SF_TFRECORD_FOOTER))) return 0;
    uint8_t *p = shard;
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)((uint64_t)size >> (8 * i));
    uint32_t c = sf_tfrecord_masked_crc(p, 8);
    for (int i = 0; i < 4; i++) p[8 + i] = (uint8_t)(c >> (8 * i));
    if (size) memcpy(p + 12, data, size);
    c = sf_tfrecord_masked_crc(data, size);
    for (int i = 0; i < 4; i++) p[12 + size + i] = (uint8_t)(c >> (8 * i));
    if (size) memcpy(p + 16 + size, data, size);
    n = 2 * size + SF_TFRECORD_HEADER + SF_TFRECORD_FOOTER;
  }
  sf_tar_reader *reader = NULL;
  sf_error error;
  if (sf_tar_reader_open_memory(&reader, shard ? shard : data, n, "fuzz.tfrecord", &error) < 0) {
    free(shard);
    return 0;
  }
  static const char *const fields[] = {"jpg=image/encoded"};
  sf_tar_reader_set_tfrecord(reader, &(sf_tfrecord_options){.key_feature = mode & 2 ? "label" : NULL,
                                                            .fields = fields, .n_fields = mode & 4 ? 1 : 0});
  sf_tar_reader_set_limits(reader, 1 << 20, 1 << 20);
  for (int i = 0; i < 100000; i++) {
    sf_sample *sample = NULL;
    int rc = sf_tar_reader_next(reader, &sample, &error);
    bool goes_on = rc == 0 || sample; /* an error with a sample spoils that record only */
    if (sample) {
      for (int f = 0; f < sample->n_fields; f++) {
        const sf_tensor *t = &sample->fields[f].tensor;
        size_t bytes = sf_tensor_nbytes(t);
        /* Touch the first and last byte so ASan sees any out-of-bounds field. */
        if (bytes > 0) {
          volatile uint8_t first = ((const uint8_t *)sf_tensor_data(t))[0];
          volatile uint8_t last = ((const uint8_t *)sf_tensor_data(t))[bytes - 1];
          (void)first;
          (void)last;
        }
      }
      sf_sample_destroy(&sample);
    }
    if (!goes_on) break;
  }
  sf_tar_reader_close(&reader);
  free(shard);
  return 0;
}
