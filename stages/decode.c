/* decode: turns encoded fields into tensors (images, class labels, .npy/.npz), checks txt/json, inflates .gz members
 * first. */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <zlib.h>

#include "shardflow/codec.h"
#include "shardflow/stage.h"

typedef struct decode {
  int mode;               /* option: sf_image_mode */
  int64_t max_pixels;     /* option */
  int64_t max_scans;      /* option */
  int64_t min_size;       /* option */
  int64_t max_field_size; /* option */
  int depth;              /* option: index into depth_names */
  bool check_text;        /* option */
  int defer_jpeg;         /* option: index into defer_names */
  int frames;             /* option: index into frames_names */
  bool defer;             /* leave baseline JPEGs undecoded: defer_jpeg, or auto and the plan allows it */
  sf_image_limits limits;
} decode;

static const char *const mode_names[] = {"rgb", "gray", "keep", NULL};
static const char *const depth_names[] = {"8", "16", "native", NULL};
static const int depth_values[] = {8, 16, -1};
enum { DEFER_AUTO, DEFER_TRUE, DEFER_FALSE };
static const char *const defer_names[] = {"auto", "true", "false", NULL};
enum { FRAMES_FIRST, FRAMES_ALL };
static const char *const frames_names[] = {"first", "all", NULL};

static const sf_option options[] = {
    {"mode", SF_OPT_ENUM, offsetof(decode, mode), "rgb", 0, 0,
     "image channels: rgb (3), gray (1, ITU-R 601-2 luma as in PIL), keep (as stored: 1, 3, or 4 "
     "with alpha)",
     mode_names},
    {"max_pixels", SF_OPT_COUNT, offsetof(decode, max_pixels), "100M", 1, 1e12,
     "largest image accepted, in pixels (width x height; 100M = 100,000,000); larger ones are "
     "errors before any memory is allocated",
     NULL},
    {"max_scans", SF_OPT_COUNT, offsetof(decode, max_scans), "500", 1, 1e6,
     "most scans a progressive JPEG may have (guards against decompression bombs)", NULL},
    {"min_size", SF_OPT_COUNT, offsetof(decode, min_size), "0", 0, 65535,
     "JPEG DCT-domain downscaling: decode at the smallest scale (1/8 steps) whose width and "
     "height both stay >= min_size pixels; 0 decodes at full size",
     NULL},
    {"max_field_size", SF_OPT_SIZE, offsetof(decode, max_field_size), "256MiB", 1, 1099511627776.0,
     "largest inflated size of a .gz field or of one .npz member, in bytes", NULL},
    {"depth", SF_OPT_ENUM, offsetof(decode, depth), "8", 0, 0,
     "image sample depth: 8 (uint8; 16-bit PNGs cut to their high byte), 16 (uint16; 8-bit samples times "
     "257), native (uint16 for 16-bit PNG, TIFF, gray JPEG 2000 and PGM/PPM with maxval > 255, uint8 otherwise); 16-bit PNM "
     "samples are kept as stored, not rescaled",
     depth_names},
    {"check_text", SF_OPT_BOOL, offsetof(decode, check_text), "true", 0, 0,
     "check txt fields are UTF-8 and json fields parse (jansson); a bad one is an error record with the "
     "byte offset or line:column. Both stay bytes",
     NULL},
    {"defer_jpeg", SF_OPT_ENUM, offsetof(decode, defer_jpeg), "auto", 0, 0,
     "leave baseline JPEGs undecoded (rgb/gray, depth 8, min_size 0) so that augment decodes only what its "
     "crop or resize reads (iMCU columns and rows), at the smallest DCT scale (1/8, 1/4, 1/2 or 1) that still "
     "covers its output. auto: where the plan allows it (the next stage, in this process, is one that takes "
     "undecoded fields, as augment; `run --explain` says); false: never; true: always (other consumers then "
     "decode it where they read it). Header errors stay this stage's records; corrupt data in the region read "
     "becomes augment's (outside it, it goes unnoticed)",
     defer_names},
    {"frames", SF_OPT_ENUM, offsetof(decode, frames), "first", 0, 0,
     "GIF frames: first (the first frame, uint8 [H, W, C]) or all (every frame, uint8 [T, H, W, C], each drawn "
     "over the last after its disposal, as Pillow's ImageSequence gives them; depth does not apply, max_pixels "
     "bounds T x H x W)",
     frames_names},
    {NULL},
};

static int init(sf_node *node) {
  decode *d = sf_node_priv(node);
  d->limits.max_pixels = d->max_pixels;
  d->limits.max_scans = (int)d->max_scans;
  d->limits.min_size = (int)d->min_size;
  d->limits.depth = depth_values[d->depth];
  d->limits.gif_frames = d->frames == FRAMES_ALL;
  d->defer = d->defer_jpeg == DEFER_TRUE || (d->defer_jpeg == DEFER_AUTO && sf_node_may_defer(node));
  return 0;
}

static void free_inflated(void *opaque, uint8_t *data) {
  (void)opaque;
  free(data);
}

/*
 * Inflates a gzip member (or several concatenated, as gzip(1) writes them;
 * trailing NUL padding is ignored as gzip(1) does) into a new buffer of at
 * most max bytes.
 */
static int gunzip(const uint8_t *in, size_t n, size_t max, sf_buffer **out, sf_error *error) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot start zlib");
  /* The trailer's ISIZE (length mod 2^32) is only a hint: the data is untrusted. */
  size_t cap = n >= 18 ? (size_t)in[n - 4] | (size_t)in[n - 3] << 8 | (size_t)in[n - 2] << 16 |
                             (size_t)in[n - 1] << 24
                       : 0;
  if (cap < 4096) cap = 4096;
  if (cap > max) cap = max;
  uint8_t *buf = malloc(cap), *grown;
  size_t len = 0, fed = 0;
  int r = 0;
  if (!buf) {
    r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate %zu bytes to inflate", cap);
    goto done;
  }
  for (;;) {
    if (len == cap) {
      if (cap >= max) {
        r = sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "inflates to more than max_field_size (%zu bytes)", max);
        goto done;
      }
      size_t next = cap > max / 2 ? max : cap * 2;
      if (!(grown = realloc(buf, next))) {
        r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate %zu bytes to inflate", next);
        goto done;
      }
      buf = grown;
      cap = next;
    }
    if (z.avail_in == 0 && fed < n) {
      z.next_in = (Bytef *)(uintptr_t)(in + fed);
      z.avail_in = n - fed > UINT32_MAX ? UINT32_MAX : (uInt)(n - fed);
      fed += z.avail_in;
    }
    z.next_out = buf + len;
    z.avail_out = cap - len > UINT32_MAX ? UINT32_MAX : (uInt)(cap - len);
    uInt before = z.avail_out;
    int zr = inflate(&z, Z_NO_FLUSH);
    len += before - z.avail_out;
    if (zr == Z_STREAM_END) {
      while (z.avail_in > 0 && *z.next_in == 0) z.next_in++, z.avail_in--;
      while (z.avail_in == 0 && fed < n && in[fed] == 0) fed++;
      if (z.avail_in == 0 && fed == n) break;
      inflateReset(&z);
    } else if (zr == Z_BUF_ERROR && z.avail_in == 0 && fed == n) {
      r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "truncated gzip data");
      goto done;
    } else if (zr != Z_OK && zr != Z_BUF_ERROR) {
      r = sf_error_set(error, zr == Z_MEM_ERROR ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE, "corrupt gzip data: %s",
                       z.msg ? z.msg : "zlib error");
      goto done;
    }
  }
  if (len < cap && (grown = realloc(buf, len ? len : 1))) buf = grown;
  *out = sf_buffer_wrap(buf, len, free_inflated, NULL);
  if (!*out) r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate a buffer");
done:
  inflateEnd(&z);
  if (r < 0) free(buf);
  return r;
}

/* Copies up to 24 bytes for a message, with non-printable bytes as '?'. */
static const char *printable(const uint8_t *p, size_t n, char *buf, size_t size) {
  size_t i = 0;
  for (; i < n && i + 4 < size && i < 24; i++) buf[i] = isprint(p[i]) ? (char)p[i] : '?';
  if (i < n && i + 4 <= size) memcpy(buf + i, "...", 3), i += 3;
  buf[i] = '\0';
  return buf;
}

/* A class label: ASCII decimal with optional sign and surrounding whitespace, as int64 scalar. */
static int parse_cls(const uint8_t *p, size_t n, sf_tensor *out, sf_error *error) {
  size_t a = 0, b = n;
  while (a < b && isspace(p[a])) a++;
  while (b > a && isspace(p[b - 1])) b--;
  char text[32], shown[32];
  bool ok = b > a && b - a < sizeof text;
  if (ok) {
    memcpy(text, p + a, b - a);
    text[b - a] = '\0';
    size_t i = text[0] == '-' || text[0] == '+';
    ok = text[i] != '\0';
    for (; ok && text[i]; i++) ok = text[i] >= '0' && text[i] <= '9';
  }
  long long v = 0;
  if (ok) {
    errno = 0;
    v = strtoll(text, NULL, 10);
    ok = errno == 0;
  }
  if (!ok)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "not a decimal class label (\"%s\")",
                        printable(p, n, shown, sizeof shown));
  int r = sf_tensor_alloc(out, SF_DTYPE_INT64, 0, NULL);
  if (r < 0) return sf_error_set(error, r, SF_NOWHERE, "cannot allocate a label");
  *(int64_t *)sf_tensor_data(out) = v;
  return 0;
}

/*
 * Offset of the first byte that does not start a well-formed UTF-8 sequence (Unicode 15, table 3-7:
 * no overlong forms, no surrogates, nothing above U+10FFFF), or n when all are. This is where
 * Python's bytes.decode('utf-8') reports its error (UnicodeDecodeError.start).
 */
static size_t utf8_invalid_at(const uint8_t *p, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = p[i];
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      i++;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + 1 >= n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; k++)
      if (i + k >= n || p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    i += len;
  }
  return n;
}

static int check_text(const char *ext, const uint8_t *p, size_t n, sf_error *error) {
  if (strcmp(ext, "txt") == 0) {
    size_t bad = utf8_invalid_at(p, n);
    if (bad < n)
      return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                          "not UTF-8: invalid byte sequence at byte offset %zu (0x%02x); re-encode the text as "
                          "UTF-8 or set check_text: false",
                          bad, p[bad]);
    return 0;
  }
  json_error_t je;
  json_t *doc = json_loadb((const char *)p, n, JSON_DECODE_ANY, &je);
  if (!doc)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "invalid JSON at line %d, column %d (byte %d): %s; fix the file or set check_text: false",
                        je.line, je.column, je.position, je.text);
  json_decref(doc);
  return 0;
}

typedef struct npz_target {
  sf_sample *sample;
  const char *field;
} npz_target;

/* Adds one .npz array as field FIELD.ARRAY (e.g. npz.x), decoded. */
static int add_npz_array(void *opaque, const char *array, sf_tensor *t, sf_error *error) {
  npz_target *to = opaque;
  char name[SF_FIELD_NAME_MAX + 1];
  int len = snprintf(name, sizeof name, "%s.%s", to->field, array);
  if (len >= SF_FIELD_NAME_MAX)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "array %s makes a field name longer than %d bytes", array,
                        SF_FIELD_NAME_MAX - 1);
  if (sf_sample_field(to->sample, name))
    return sf_error_set(error, SF_EDUP, SF_NOWHERE, "array %s makes field %s, which the sample already has", array,
                        name);
  if (!sf_sample_add_field(to->sample, name, false, t))
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "array %s: the sample has no room for more than %d fields",
                        array, SF_MAX_FIELDS);
  return 0;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int decode_field(decode *d, sf_sample *sample, sf_field *f, sf_error *error) {
  if (!f->encoded) return 0;
  sf_tensor *t = &f->tensor;
  if (t->dtype != SF_DTYPE_UINT8 || t->ndim != 1 || !t->buffer || !sf_tensor_is_contiguous(t))
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "is marked encoded but does not hold bytes");
  size_t size = (size_t)t->shape[0];
  int r;
  if (ends_with(f->name, ".gz")) {
    sf_buffer *inflated = NULL;
    if ((r = gunzip(sf_tensor_data(t), size, (size_t)d->max_field_size, &inflated, error)) < 0) return r;
    char name[SF_FIELD_NAME_MAX];
    snprintf(name, sizeof name, "%.*s", (int)(strlen(f->name) - 3), f->name);
    if (sf_sample_field(sample, name)) {
      sf_buffer_unref(&inflated);
      return sf_error_set(error, SF_EDUP, SF_NOWHERE, "inflates to field %s, which the sample already has", name);
    }
    size = sf_buffer_size(inflated);
    sf_tensor_clear(t);
    const int64_t shape[1] = {(int64_t)size};
    if ((r = sf_tensor_view(t, SF_DTYPE_UINT8, 1, shape, inflated, 0)) < 0)
      return sf_error_set(error, r, SF_NOWHERE, "cannot wrap inflated bytes");
    memcpy(f->name, name, sizeof name);
  }
  const char *dot = strrchr(f->name, '.');
  const char *ext = dot ? dot + 1 : f->name;
  sf_tensor decoded;
  if (d->defer && sf_image_format_known(ext) &&
      (r = sf_image_defer_jpeg(f, (sf_image_mode)d->mode, &d->limits)) != 0) {
    return r < 0 ? sf_error_set(error, r, SF_NOWHERE, "cannot allocate a JPEG recipe") : 0;
  } else if (sf_image_format_known(ext)) {
    r = sf_image_decode(ext, t->buffer, t->offset, size, (sf_image_mode)d->mode, &d->limits,
                        &decoded, error);
  } else if (strcmp(ext, "cls") == 0) {
    r = parse_cls(sf_tensor_data(t), size, &decoded, error);
  } else if (strcmp(ext, "npy") == 0) {
    r = sf_npy_read(t->buffer, t->offset, size, &decoded, error);
  } else if (strcmp(ext, "npz") == 0) {
    /* The archive's arrays become fields appended to the sample; the npz field itself goes
       (the caller removes fields marked so). */
    npz_target to = {sample, f->name};
    if ((r = sf_npz_read(t->buffer, t->offset, size, (size_t)d->max_field_size, add_npz_array, &to, error)) < 0)
      return r;
    sf_tensor_clear(t);
    f->encoded = false;
    return 1;
  } else {
    /* Text stays bytes, now marked decoded (checked first unless check_text is off); unknown
       fields pass through untouched. */
    if (strcmp(ext, "txt") == 0 || strcmp(ext, "json") == 0) {
      if (d->check_text && (r = check_text(ext, sf_tensor_data(t), size, error)) < 0) return r;
      f->encoded = false;
    }
    return 0;
  }
  if (r < 0) return r;
  sf_tensor_clear(t);
  *t = decoded;
  f->encoded = false;
  return 0;
}

static int map(sf_node *node, sf_sample **ps) {
  decode *d = sf_node_priv(node);
  sf_sample *sample = *ps;
  for (int i = 0; i < sample->n_fields; i++) {
    sf_error error = {.code = 0};
    char name[SF_FIELD_NAME_MAX];
    memcpy(name, sample->fields[i].name, sizeof name);
    int r = decode_field(d, sample, &sample->fields[i], &error);
    if (r < 0) {
      sf_node_error(node, r, sf_sample_url(sample), sample->key, sample->offset, "field %s: %s", name, error.message);
      return r;
    }
    if (r == 1) sf_sample_remove_field(sample, i--); /* an .npz, now one field per array */
  }
  return 0;
}

const sf_stage_def sf_stage_decode = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "decode",
    .summary = "decodes JPEG/PNG/WebP/TIFF/GIF/JPEG 2000/AVIF/JPEG XL/PPM/PGM images to uint8 (or uint16) [H,W,C], cls to int64, npy/npz to tensors; "
               "checks txt (UTF-8) and json; inflates .gz fields",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP | SF_STAGE_MAKES_DEFERRED,
    .priv_size = sizeof(decode),
    .options = options,
    .init = init,
    .map = map,
};
