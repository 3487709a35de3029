/* TFRecord: CRC32C of frames and tf.train.Example records (protobuf-c, engine/io/example.proto) as sample fields. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "example.pb-c.h"
#include "tfrecord.h"
#include "shardflow/handoff.h"

/*
 * Slicing-by-8 tables of the reflected Castagnoli polynomial 0x82f63b78, built once. Every record's bytes
 * go through this, so eight bytes per step (about 1 GB/s) rather than one; no Debian library the engine
 * already links offers CRC32C.
 */
static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++)
    for (int s = 1; s < 8; s++) table[s][i] = (table[s - 1][i] >> 8) ^ table[0][table[s - 1][i] & 0xff];
}

uint32_t sf_crc32c(uint32_t crc, const void *data, size_t n) {
  pthread_once(&table_once, build_table);
  const uint8_t *p = data;
  crc = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
    crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
          table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
  }
  for (; n > 0; p++, n--) crc = (crc >> 8) ^ table[0][(crc ^ *p) & 0xff];
  return ~crc;
}

uint32_t sf_tfrecord_masked_crc(const void *data, size_t n) {
  uint32_t crc = sf_crc32c(0, data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static int say(char *message, size_t size, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int say(char *message, size_t size, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, size, fmt, ap);
  va_end(ap);
  return code;
}

/* The key_feature's value as the sample's key: one bytes value, or one int64 in decimal. */
static int set_key(sf_sample *sample, const char *name, const Sftf__Feature *f, char *message, size_t size) {
  int rc;
  if (f->kind_case == SFTF__FEATURE__KIND_BYTES_LIST && f->bytes_list->n_value == 1) {
    rc = sf_sample_set_key(sample, (const char *)f->bytes_list->value[0].data, f->bytes_list->value[0].len);
  } else if (f->kind_case == SFTF__FEATURE__KIND_INT64_LIST && f->int64_list->n_value == 1) {
    char text[24];
    int len = snprintf(text, sizeof text, "%" PRId64, f->int64_list->value[0]);
    rc = sf_sample_set_key(sample, text, (size_t)len);
  } else {
    return say(message, size, SF_EFORMAT, "feature \"%s\", named by tfrecord_key, is not one bytes or int64 value",
               name);
  }
  return rc < 0 ? say(message, size, rc, "out of memory for the key") : 0;
}

static int add_feature(sf_sample *sample, const char *name, const Sftf__Feature *f, char *message, size_t size) {
  int rc = 0;
  switch (f->kind_case) {
  case SFTF__FEATURE__KIND_BYTES_LIST: {
    const Sftf__BytesList *l = f->bytes_list;
    if (l->n_value != 1)
      return say(message, size, SF_EUNSUPPORTED,
                 "feature \"%s\" is a bytes_list of %zu values — only one value per bytes feature is read "
                 "(an encoded field)", name, l->n_value);
    int64_t shape[1] = {(int64_t)l->value[0].len};
    rc = sf_sample_add_field_copy(sample, name, true, SF_DTYPE_UINT8, 1, shape, l->value[0].data);
    break;
  }
  case SFTF__FEATURE__KIND_INT64_LIST: {
    int64_t shape[1] = {(int64_t)f->int64_list->n_value};
    rc = sf_sample_add_field_copy(sample, name, false, SF_DTYPE_INT64, shape[0] == 1 ? 0 : 1, shape,
                                  f->int64_list->value);
    break;
  }
  case SFTF__FEATURE__KIND_FLOAT_LIST: {
    int64_t shape[1] = {(int64_t)f->float_list->n_value};
    rc = sf_sample_add_field_copy(sample, name, false, SF_DTYPE_FLOAT32, shape[0] == 1 ? 0 : 1, shape,
                                  f->float_list->value);
    break;
  }
  default: return 0; /* no kind: no value to give */
  }
  if (rc == SF_EDUP) return say(message, size, SF_EDUP, "feature \"%s\" appears twice in the Example", name);
  if (rc < 0) return say(message, size, rc == SF_EINVAL ? SF_ETOOBIG : rc, "cannot add feature \"%s\"", name);
  return 0;
}

/* The field a feature becomes: FIELD of an item "FIELD=FEATURE", else the feature's own name. */
static const char *field_name(const sf_tfrecord_options *o, const char *feature, char *buf, size_t size) {
  for (int i = 0; o && i < o->n_fields; i++) {
    const char *eq = strchr(o->fields[i], '=');
    if (eq && strcmp(eq + 1, feature) == 0 && (size_t)(eq - o->fields[i]) < size) {
      memcpy(buf, o->fields[i], (size_t)(eq - o->fields[i]));
      buf[eq - o->fields[i]] = '\0';
      return buf;
    }
  }
  return feature;
}

int sf_tfrecord_parse_example(const uint8_t *data, size_t n, const sf_tfrecord_options *options, sf_sample *sample,
                              char *message, size_t size) {
  const char *key_feature = options ? options->key_feature : NULL;
  Sftf__Example *example = sftf__example__unpack(NULL, n, data);
  if (!example)
    return say(message, size, SF_EFORMAT, "the record is not a tf.train.Example (protobuf-c cannot parse its %zu bytes)",
               n);
  int rc = 0;
  bool keyed = false;
  bool want_key = key_feature && key_feature[0];
  const Sftf__Features *features = example->features;
  size_t n_features = features ? features->n_feature : 0;
  if (n_features > (size_t)SF_MAX_FIELDS + want_key)
    rc = say(message, size, SF_ETOOBIG, "the Example has %zu features, over the %d fields a sample may hold", n_features,
             SF_MAX_FIELDS);
  for (size_t i = 0; rc == 0 && i < n_features; i++) {
    const Sftf__Features__FeatureEntry *e = features->feature[i];
    const char *name = e->key ? e->key : "";
    if (!e->value) continue; /* an entry without a Feature: no value */
    if (want_key && strcmp(name, key_feature) == 0) {
      rc = keyed ? say(message, size, SF_EDUP, "feature \"%s\" appears twice in the Example", name)
                 : set_key(sample, name, e->value, message, size);
      keyed = true;
      continue;
    }
    char buf[SF_FIELD_NAME_MAX];
    name = field_name(options, name, buf, sizeof buf);
    if (name[0] == '\0') rc = say(message, size, SF_EFORMAT, "a feature has an empty name");
    else if (strlen(name) >= SF_FIELD_NAME_MAX)
      rc = say(message, size, SF_ETOOBIG, "feature name \"%.40s...\" is longer than %d bytes, the longest field name",
               name, SF_FIELD_NAME_MAX - 1);
    else rc = add_feature(sample, name, e->value, message, size);
  }
  if (rc == 0 && want_key && !keyed)
    rc = say(message, size, SF_ENOENT, "the Example has no feature \"%s\" (tfrecord_key) to key the sample by",
             key_feature);
  sftf__example__free_unpacked(example, NULL);
  return rc;
}
