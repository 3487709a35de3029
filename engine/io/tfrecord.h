/* TFRecord shards: CRC32C (masked, as TFRecord frames records) and tf.train.Example records as samples. */
#ifndef SF_ENGINE_TFRECORD_H
#define SF_ENGINE_TFRECORD_H

#include <stddef.h>
#include <stdint.h>

#include "shardflow/error.h"
#include "shardflow/sample.h"
#include "shardflow/shard_io.h" /* sf_tfrecord_options */

/* Bytes of a record's frame before its data (uint64 length, masked CRC32C of the length) and after it (its CRC). */
enum { SF_TFRECORD_HEADER = 12, SF_TFRECORD_FOOTER = 4 };

/* CRC32C (Castagnoli, RFC 3720) of n bytes, continuing crc (0 to start). */
uint32_t sf_crc32c(uint32_t crc, const void *data, size_t n);

/* TFRecord's masked CRC32C of n bytes: ((crc >> 15) | (crc << 17)) + 0xa282ead8, as stored in a frame. */
uint32_t sf_tfrecord_masked_crc(const void *data, size_t n);

/*
 * Parses the n bytes of one record as a tf.train.Example and appends its features to sample, each a
 * field named by its feature key (or the FIELD an options->fields item gives it): a bytes_list of one value as an encoded uint8 [n] field; an
 * int64_list as int64 and a float_list as float32, a scalar for one value and 1-D [n] otherwise
 * (an empty list gives [0]); a feature without a kind is passed over. When options->key_feature is set,
 * that feature (a bytes_list of one value, or an int64_list of one value) becomes the
 * sample's key instead of a field, and a record without it is refused.
 * Returns 0, or: SF_EFORMAT (not an Example), SF_EUNSUPPORTED (a bytes_list of several values),
 * SF_ETOOBIG (a key over SF_FIELD_NAME_MAX - 1 bytes, more than SF_MAX_FIELDS features), SF_EDUP,
 * SF_ENOENT (no key_feature), SF_ENOMEM; *message (size bytes) then says what, for the caller's error.
 * Fields added before a failure stay in sample: callers drop the sample.
 */
int sf_tfrecord_parse_example(const uint8_t *data, size_t n, const sf_tfrecord_options *options, sf_sample *sample,
                              char *message, size_t size);

#endif
