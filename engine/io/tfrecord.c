/* TFRecord: CRC32C of frames and tf.train.Example records (protobuf-c, engine/io/example.proto) as sample fields. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example.pb-c.h"
#include "tfrecord.h"

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

/* Appends a field holding a copy of data (the engine's own sf_sample_add_field_copy sits in a higher layer). */
static int add_copy(sf_sample *sample, const char *name, bool encoded, sf_dtype dtype, int ndim, const int64_t *shape,
                    const void *data) {
  if (sf_sample_field(sample, name)) return SF_EDUP;
  sf_tensor t = {0};
  int rc = sf_tensor_alloc(&t, dtype, ndim, shape);
  if (rc < 0) return rc;
  size_t bytes = sf_tensor_nbytes(&t);
  if (bytes > 0) memcpy(sf_tensor_data(&t), data, bytes); /* empty values may be NULL, which memcpy must not see */
  return sf_sample_add_field(sample, name, encoded, &t) ? 0 : SF_EINVAL;
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
    rc = add_copy(sample, name, true, SF_DTYPE_UINT8, 1, shape, l->value[0].data);
    break;
  }
  case SFTF__FEATURE__KIND_INT64_LIST: {
    int64_t shape[1] = {(int64_t)f->int64_list->n_value};
    rc = add_copy(sample, name, false, SF_DTYPE_INT64, shape[0] == 1 ? 0 : 1, shape,
                                  f->int64_list->value);
    break;
  }
  case SFTF__FEATURE__KIND_FLOAT_LIST: {
    int64_t shape[1] = {(int64_t)f->float_list->n_value};
    rc = add_copy(sample, name, false, SF_DTYPE_FLOAT32, shape[0] == 1 ? 0 : 1, shape,
                                  f->float_list->value);
    break;
  }
  default: return 0; /* no kind: no value to give */
  }
  if (rc == SF_EDUP) return say(message, size, SF_EDUP, "feature \"%s\" appears twice in the Example", name);
  if (rc < 0) return say(message, size, rc == SF_EINVAL ? SF_ETOOBIG : rc, "cannot add feature \"%s\"", name);
  return 0;
}

/* Reads a varint at *p (before end) into *v. Returns false when it runs past end or over 10 bytes. */
static bool varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  *v = 0;
  for (int shift = 0; shift < 70 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    *v |= (uint64_t)(b & 0x7f) << (shift < 64 ? shift : 0);
    if (!(b & 0x80)) return true;
  }
  return false;
}

/*
 * Counts the length-delimited fields numbered `field` in the message at [p, end), calling inner on each
 * (when not NULL) to count what it holds; the most any one inner call found goes to *deepest. Returns
 * false on wire damage (protobuf-c then says so).
 */
static bool count_fields(const uint8_t *p, const uint8_t *end, uint32_t field, size_t *count,
                         bool (*inner)(const uint8_t *, const uint8_t *, size_t *), size_t *deepest) {
  while (p < end) {
    uint64_t tag, len;
    if (!varint(&p, end, &tag)) return false;
    switch (tag & 7) {
    case 0:
      if (!varint(&p, end, &len)) return false;
      break;
    case 1:
      if (end - p < 8) return false;
      p += 8;
      break;
    case 5:
      if (end - p < 4) return false;
      p += 4;
      break;
    case 2:
      if (!varint(&p, end, &len) || len > (uint64_t)(end - p)) return false;
      if (tag >> 3 == field) {
        (*count)++;
        size_t n = 0;
        if (inner && !inner(p, p + len, &n)) return false;
        if (inner && n > *deepest) *deepest = n;
      }
      p += len;
      break;
    default: return false;
    }
  }
  return true;
}

/* BytesList (field 1 of a Feature): its values. */
static bool feature_values(const uint8_t *p, const uint8_t *end, size_t *n) {
  size_t values = 0;
  const uint8_t *q = p;
  /* Values of every bytes_list field of the Feature (protobuf merges repeated ones). */
  while (q < end) {
    uint64_t tag, len;
    if (!varint(&q, end, &tag) || (tag & 7) != 2 || !varint(&q, end, &len) || len > (uint64_t)(end - q)) return true;
    if (tag >> 3 == 1) {
      size_t none = 0;
      if (!count_fields(q, q + len, 1, &values, NULL, &none)) return true;
    }
    q += len;
  }
  *n = values;
  return true;
}

/* A FeatureEntry: the most values a bytes_list of its Feature (field 2) holds. */
static bool entry_values(const uint8_t *p, const uint8_t *end, size_t *n) {
  size_t features = 0;
  return count_fields(p, end, 2, &features, feature_values, n);
}

/* Features: its entries (field 1), or SIZE_MAX when one holds a bytes_list of several values. */
static bool features_entries(const uint8_t *p, const uint8_t *end, size_t *n) {
  size_t values = 0;
  if (!count_fields(p, end, 1, n, entry_values, &values)) return false;
  if (values > 1) *n = SIZE_MAX; /* refused anyway */
  return true;
}

/*
 * protobuf-c allocates a struct per map entry and 16 bytes per bytes value, 8 to 20 times the bytes
 * that encode them: a record of empty entries would cost gigabytes before being refused. The wire is
 * walked first, and a record with more entries than a sample holds fields, or a bytes_list of several
 * values, is refused without unpacking it.
 */
static int precheck(const uint8_t *data, size_t n, size_t most, char *message, size_t size) {
  size_t messages = 0, entries = 0;
  /* Several features fields of the Example merge into one: their entries add up. */
  const uint8_t *p = data, *end = data + n;
  while (p < end) {
    uint64_t tag, len;
    if (!varint(&p, end, &tag)) return 0; /* protobuf-c reports the damage */
    if ((tag & 7) != 2) break;            /* Example has only length-delimited fields: protobuf-c's to judge */
    if (!varint(&p, end, &len) || len > (uint64_t)(end - p)) return 0;
    size_t k = 0;
    if (tag >> 3 == 1) {
      messages++;
      if (!features_entries(p, p + len, &k)) return 0;
      entries = k == SIZE_MAX || entries > SIZE_MAX - k ? SIZE_MAX : entries + k;
    }
    p += len;
  }
  if (entries == SIZE_MAX)
    return say(message, size, SF_EUNSUPPORTED, "a feature is a bytes_list of several values — only one value "
               "per bytes feature is read (an encoded field)");
  if (entries > most)
    return say(message, size, SF_ETOOBIG, "the Example has %zu features, over the %d fields a sample may hold",
               entries, SF_MAX_FIELDS);
  return 0;
}

/*
 * What protobuf-c may allocate to unpack one record: the values it holds need at most 8 bytes per byte
 * of wire (a packed int64 of one byte); anything more (unknown fields by the million, empty entries) is a
 * hostile record, refused before it costs more.
 */
typedef struct budget {
  size_t used, limit;
  bool refused; /* an allocation went over the limit */
} budget;

typedef struct {
  size_t size;
  max_align_t align;
} block;

static void *budget_alloc(void *opaque, size_t size) {
  budget *b = opaque;
  if (size > b->limit - b->used) {
    b->refused = true;
    return NULL;
  }
  block *k = malloc(offsetof(block, align) + size);
  if (!k) return NULL;
  k->size = size;
  b->used += size;
  return &k->align;
}

static void budget_free(void *opaque, void *pointer) {
  if (!pointer) return;
  budget *b = opaque;
  block *k = (block *)((char *)pointer - offsetof(block, align));
  b->used -= k->size;
  free(k);
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
  int pre = precheck(data, n, (size_t)SF_MAX_FIELDS + (key_feature && key_feature[0]), message, size);
  if (pre < 0) return pre;
  budget b = {.limit = n > SIZE_MAX / 16 ? SIZE_MAX / 2 : 8 * n + 4096};
  ProtobufCAllocator allocator = {.alloc = budget_alloc, .free = budget_free, .allocator_data = &b};
  Sftf__Example *example = sftf__example__unpack(&allocator, n, data);
  if (!example)
    return say(message, size, SF_EFORMAT, "the record is not a tf.train.Example (protobuf-c cannot parse its %zu bytes%s)",
               n, b.refused ? ": it needs over 8 times their size in memory" : "");
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
  sftf__example__free_unpacked(example, &allocator);
  return rc;
}
