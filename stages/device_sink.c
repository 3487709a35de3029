/* device_sink: the last stage; hands batches to the trainer (host or GPU memory), dumps .npy files and a preview. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "shardflow/codec.h"
#include "shardflow/device.h"
#include "shardflow/stage.h"
#include "shardflow/storage.h"

enum { NORMALIZE_OFF, NORMALIZE_FLOAT32, NORMALIZE_BFLOAT16 };
static const char *const normalize_names[] = {"off", "float32", "bfloat16", NULL};

typedef struct device_sink {
  char *npy_dir;         /* option */
  int64_t npy_batches;   /* option */
  char *preview_png;     /* option */
  sf_float_list mean;    /* option */
  sf_float_list std;     /* option */
  char *image_field;     /* option */
  char *device;          /* option */
  int64_t prefetch;      /* option */
  int normalize;         /* option */
  sf_device_pool *pool;  /* device: cuda[:N]; NULL on the host */
  sf_buffer *tables;     /* normalize: augment's tables (sf_lazy_tables) */
  uint8_t *channel_tables; /* normalize: the tables of the batches' channels, contiguous, for the kernel */
  int64_t table_channels;  /* channels channel_tables holds (0: not made yet) */
  uint64_t device_allocs, pinned_allocs; /* the pool's counts already added to the node's counters */
  bool npy_ready;        /* npy_dir exists */
  bool npy_off;          /* a dump failed under the skip policy: stop trying */
  bool preview_done;     /* the first batch of the run was seen */
} device_sink;

static const sf_option options[] = {
    {"npy_dir", SF_OPT_STRING, offsetof(device_sink, npy_dir), "", 0, 0,
     "directory for e<epoch>_b<batch>_<field>.npy and _keys.txt dumps of every batch (\"\" = off)",
     NULL},
    {"npy_batches", SF_OPT_COUNT, offsetof(device_sink, npy_batches), "0", 0, 0,
     "dump only the first N batches of each epoch (0 = all)", NULL},
    {"preview_png", SF_OPT_STRING, offsetof(device_sink, preview_png), "", 0, 0,
     "PNG file for a labelled grid of up to 64 images of the first batch, in a directory that "
     "exists (\"\" = off)",
     NULL},
    {"mean", SF_OPT_FLOAT_LIST, offsetof(device_sink, mean), "", 0, 0,
     "per-channel mean (0..1 units, as augment's mean): what `normalize` subtracts on the GPU, and "
     "what the preview adds back to float images",
     NULL},
    {"std", SF_OPT_FLOAT_LIST, offsetof(device_sink, std), "", 0, 0,
     "per-channel standard deviation (as augment's std), for `normalize` and the preview", NULL},
    {"image_field", SF_OPT_STRING, offsetof(device_sink, image_field), "", 0, 0,
     "batch field drawn in the preview and normalised by `normalize` (\"\" = the first [B,C,H,W], "
     "[B,H,W,C] or [B,H,W] field; for `normalize`, the first uint8 [B,H,W,C] or [B,C,H,W] one)",
     NULL},
    {"device", SF_OPT_STRING, offsetof(device_sink, device), "cpu", 0, 0,
     "where batches are handed out: cpu (host memory), or cuda / cuda:N (GPU N's memory, copied "
     "asynchronously on a stream of the sink's own; DLPack tensors on that GPU; needs the NVIDIA "
     "driver, loaded at run time)",
     NULL},
    {"prefetch", SF_OPT_COUNT, offsetof(device_sink, prefetch), "2", 1, 16,
     "with a cuda device: batches copied to the GPU ahead of the trainer (each holds one batch of "
     "device memory until the trainer drops it)",
     NULL},
    {"normalize", SF_OPT_ENUM, offsetof(device_sink, normalize), "off", 0, 0,
     "with a cuda device: turn the uint8 image field into float32 or bfloat16 [B,C,H,W] on the GPU, "
     "x/255 then (x - mean)/std, the same values as augment's dtype float32/bfloat16 (the copy moves "
     "4x or 2x fewer bytes); off keeps it as it comes",
     normalize_names},
    {NULL},
};

static bool is_set(const char *s) { return s && s[0]; }

static void wake(void *node) { sf_node_notify(node); }

/* device: cpu (-1), cuda (0) or cuda:N (N); -2 for anything else. */
static int parse_device(const char *text) {
  if (!is_set(text) || strcmp(text, "cpu") == 0) return -1;
  if (strcmp(text, "cuda") == 0) return 0;
  if (strncmp(text, "cuda:", 5) != 0 || text[5] < '0' || text[5] > '9') return -2;
  char *end;
  long n = strtol(text + 5, &end, 10);
  return *end || n > 1023 ? -2 : (int)n;
}

static int open_device(sf_node *node, device_sink *s) {
  int ordinal = parse_device(s->device);
  if (ordinal == -2)
    return sf_node_option_error(node, "device", "'%s' is not a device: write cpu, cuda or cuda:N (N = 0, 1, ...)",
                                s->device);
  if (ordinal == -1) {
    if (s->normalize != NORMALIZE_OFF)
      return sf_node_option_error(node, "normalize", "normalize runs on the GPU: set device: cuda (or cuda:N), "
                                  "or normalize in augment (dtype float32, mean, std) instead");
    return 0;
  }
  sf_error e = {0};
  int r = sf_device_pool_open(&s->pool, ordinal, &e);
  if (r == SF_EOPTION) return sf_node_option_error(node, "device", "%s; or use device: cpu on this machine", e.message);
  if (r < 0) {
    sf_node_error(node, r, NULL, NULL, -1, "device %s: %s", s->device, e.message);
    return r;
  }
  sf_device_pool_set_wake(s->pool, wake, node);
  /* Shown in the stage table, --stats-json and /metrics: a steady run stops adding to them. */
  if ((r = sf_node_counter_add(node, "gpu_buffers_allocated", 0)) < 0 ||
      (r = sf_node_counter_add(node, "pinned_buffers_allocated", 0)) < 0)
    return r;
  if (s->normalize != NORMALIZE_OFF) {
    if ((r = sf_image_tables_new(s->mean.v, s->std.v, s->mean.n, &s->tables)) < 0) return r;
  }
  return 0;
}

static int init(sf_node *node) {
  device_sink *s = sf_node_priv(node);
  if (s->mean.n != s->std.n && s->mean.n && s->std.n) {
    sf_node_error(node, SF_EOPTION, NULL, NULL, -1,
                  "mean has %d values but std has %d; give both with one value per channel",
                  s->mean.n, s->std.n);
    return SF_EOPTION;
  }
  if (is_set(s->preview_png)) { /* a typo in the path is an error now, not a new directory tree */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", s->preview_png);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    struct stat st;
    int found = stat(dir, &st) == 0 ? 0 : errno;
    if (found || !S_ISDIR(st.st_mode)) {
      sf_node_error(node, SF_EOPTION, s->preview_png, NULL, -1,
                    "preview_png %s: its directory %s: %s; create it or fix the path", s->preview_png, dir,
                    found ? strerror(found) : "not a directory");
      return SF_EOPTION;
    }
  }
  if (s->normalize != NORMALIZE_OFF && s->mean.n != s->std.n)
    return sf_node_option_error(node, NULL, "normalize needs mean and std with one value per channel each, or "
                                "neither (x/255 only); mean has %d values, std %d", s->mean.n, s->std.n);
  if (s->normalize != NORMALIZE_OFF)
    for (int i = 0; i < s->std.n; i++)
      if (!(s->std.v[i] > 0))
        return sf_node_option_error(node, "std", "value %d is %g; a standard deviation must be above 0", i,
                                    s->std.v[i]);
  return open_device(node, s);
}

static void uninit(sf_node *node) {
  device_sink *s = sf_node_priv(node);
  sf_device_pool_destroy(&s->pool); /* stops its wake calls; batches still out keep the rest */
  sf_buffer_unref(&s->tables);
  free(s->channel_tables);
}

/* Reports a failed debug write; under `skip` the batch still goes on and dumps stop. */
static int dump_error(sf_node *node, device_sink *s, const char *path, const char *what) {
  s->npy_off = true;
  return sf_node_error(node, SF_EIO, path, NULL, -1, "%s", what);
}

static int dump_npy(sf_node *node, device_sink *s, const sf_batch *b) {
  char path[4096], why[4800];
  if (!s->npy_ready) {
    sf_error err = {0};
    if (sf_dir_create(s->npy_dir, &err) < 0) {
      snprintf(why, sizeof why, "npy_dir: %s", err.message);
      return dump_error(node, s, s->npy_dir, why);
    }
    s->npy_ready = true;
  }
  unsigned epoch = (unsigned)b->epoch;
  unsigned long long index = (unsigned long long)b->index;
  for (int i = 0; i < b->n_fields; i++) {
    char name[SF_FIELD_NAME_MAX];
    snprintf(name, sizeof name, "%s", b->fields[i].name);
    for (char *c = name; *c; c++)
      if (*c == '/') *c = '_';
    snprintf(path, sizeof path, "%s/e%03u_b%06llu_%s.npy", s->npy_dir, epoch, index, name);
    sf_error err = {0};
    if (sf_npy_write(path, &b->fields[i].tensor, &err) < 0)
      return dump_error(node, s, path, err.message);
  }
  snprintf(path, sizeof path, "%s/e%03u_b%06llu_keys.txt", s->npy_dir, epoch, index);
  FILE *f = fopen(path, "w");
  int ok = f != NULL;
  for (int64_t i = 0; ok && i < b->size; i++) ok = fprintf(f, "%s\n", sf_batch_key(b, i)) >= 0;
  if (f && fclose(f) != 0) ok = 0;
  if (!ok) {
    snprintf(why, sizeof why, "cannot write %s: %s (check the directory and free disk space)", path,
             strerror(errno));
    return dump_error(node, s, path, why);
  }
  return 0;
}

/* ---- preview grid ---- */

/* Tiles show images at 2x; images larger than MAX_SIDE/2 are shrunk to MAX_SIDE instead, so
 * 64 tiles of big images still make a PNG of sane size. */
enum { SCALE = 2, MAX_SIDE = 256, GAP = 2, FONT_W = 5, FONT_H = 7, LABEL_H = FONT_H + 2,
       MAX_TILES = 64 };

/* 5x7 digits and '-', one row per byte, most significant of the low 5 bits on the left. */
static const uint8_t font[11][FONT_H] = {
    {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}, {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E},
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}, {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E},
    {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}, {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E},
    {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}, {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},
    {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}, {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C},
    {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00},
};

typedef struct canvas {
  uint8_t *rgb;
  int64_t w, h;
} canvas;

static void draw_text(canvas *cv, int64_t x0, int64_t y0, int64_t max_w, const char *text) {
  for (int64_t k = 0; text[k]; k++) {
    int g = text[k] == '-' ? 10 : text[k] - '0';
    if (g < 0 || g > 10) continue;
    for (int y = 0; y < FONT_H; y++)
      for (int x = 0; x < FONT_W; x++) {
        int64_t px = x0 + k * (FONT_W + 1) + x;
        if (!(font[g][y] >> (FONT_W - 1 - x) & 1) || px >= x0 + max_w || px >= cv->w) continue;
        memset(cv->rgb + ((y0 + y) * cv->w + px) * 3, 255, 3);
      }
  }
}

/* Where the pixels are: batch index b, channel c, row y, column x -> element offset. */
typedef struct image_layout {
  const sf_tensor *t;
  int64_t h, w, c;
  int64_t sb, sc, sy, sx; /* strides in elements */
} image_layout;

static bool find_layout(const sf_tensor *t, image_layout *l) {
  memset(l, 0, sizeof *l);
  l->t = t;
  if (t->ndim == 3) { /* [B, H, W]: gray */
    l->h = t->shape[1], l->w = t->shape[2], l->c = 1;
    l->sb = t->strides[0], l->sy = t->strides[1], l->sx = t->strides[2];
  } else if (t->ndim == 4) {
    bool chw = (t->shape[1] == 1 || t->shape[1] == 3) && t->shape[3] != 1 && t->shape[3] != 3;
    l->sb = t->strides[0];
    if (chw) {
      l->c = t->shape[1], l->h = t->shape[2], l->w = t->shape[3];
      l->sc = t->strides[1], l->sy = t->strides[2], l->sx = t->strides[3];
    } else {
      l->h = t->shape[1], l->w = t->shape[2], l->c = t->shape[3];
      l->sy = t->strides[1], l->sx = t->strides[2], l->sc = t->strides[3];
    }
  } else {
    return false;
  }
  return l->h > 0 && l->w > 0 && l->c > 0 && l->h <= 65536 && l->w <= 65536 && t->buffer &&
         (t->dtype == SF_DTYPE_UINT8 || t->dtype == SF_DTYPE_FLOAT32 ||
          t->dtype == SF_DTYPE_BFLOAT16);
}

static double element(const sf_tensor *t, int64_t at) {
  const uint8_t *base = sf_tensor_data(t);
  switch (t->dtype) {
  case SF_DTYPE_UINT8: return base[at];
  case SF_DTYPE_FLOAT32: {
    float f;
    memcpy(&f, base + at * 4, 4);
    return f;
  }
  case SF_DTYPE_BFLOAT16: {
    uint16_t h;
    memcpy(&h, base + at * 2, 2);
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
  }
  default: return 0;
  }
}

/* Paints image b into a th x tw tile at (x0, y0), nearest neighbour, as 8-bit RGB. */
static void draw_image(canvas *cv, const image_layout *l, const device_sink *s, int64_t b,
                       int64_t x0, int64_t y0, int64_t th, int64_t tw) {
  const sf_tensor *t = l->t;
  int64_t channels = l->c >= 3 ? 3 : 1;
  bool is_float = t->dtype != SF_DTYPE_UINT8;
  bool unnormalise = is_float && (s->mean.n || s->std.n);
  double lo = 0, hi = 255;
  if (is_float && !unnormalise) { /* no mean/std given: stretch each image to 0..255 */
    lo = INFINITY, hi = -INFINITY;
    for (int64_t c = 0; c < channels; c++)
      for (int64_t y = 0; y < l->h; y++)
        for (int64_t x = 0; x < l->w; x++) {
          double v = element(t, b * l->sb + c * l->sc + y * l->sy + x * l->sx);
          if (v < lo) lo = v;
          if (v > hi) hi = v;
        }
    if (!(hi > lo)) hi = lo + 1;
  }
  for (int64_t ty = 0; ty < th; ty++)
    for (int64_t tx = 0; tx < tw; tx++) {
      int64_t y = ty * l->h / th, x = tx * l->w / tw;
      uint8_t px[3];
      for (int64_t c = 0; c < channels; c++) {
        double v = element(t, b * l->sb + c * l->sc + y * l->sy + x * l->sx);
        if (unnormalise) {
          double sd = s->std.n ? s->std.v[c % s->std.n] : 1.0;
          double mu = s->mean.n ? s->mean.v[c % s->mean.n] : 0.0;
          v = (v * sd + mu) * 255.0; /* augment normalises x/255, so undo both */
        } else if (is_float) {
          v = (v - lo) / (hi - lo) * 255.0;
        }
        v = v > 255 ? 255 : v >= 0 ? v : 0; /* NaN becomes 0 */
        px[c] = (uint8_t)lrint(v);
      }
      if (channels == 1) px[1] = px[2] = px[0];
      memcpy(cv->rgb + ((y0 + ty) * cv->w + x0 + tx) * 3, px, 3);
    }
}

static const sf_field *preview_field(const device_sink *s, const sf_batch *b) {
  if (is_set(s->image_field)) return sf_batch_field(b, s->image_field);
  for (int i = 0; i < b->n_fields; i++) {
    const sf_tensor *t = &b->fields[i].tensor;
    if ((t->ndim == 4 || t->ndim == 3) && !b->fields[i].encoded)
      return &b->fields[i];
  }
  return NULL;
}

static int write_preview(sf_node *node, device_sink *s, const sf_batch *b) {
  const char *path = s->preview_png;
  const sf_field *f = preview_field(s, b);
  image_layout l;
  if (!f || !find_layout(&f->tensor, &l))
    return sf_node_error(node, SF_EUNSUPPORTED, path, NULL, -1,
                         "no image field to preview%s%s%s: preview_png needs a uint8, float32 or "
                         "bfloat16 [B,C,H,W], [B,H,W,C] or [B,H,W] field (set image_field)",
                         is_set(s->image_field) ? " (image_field '" : "",
                         is_set(s->image_field) ? s->image_field : "",
                         is_set(s->image_field) ? "' is missing or not an image)" : "");
  const sf_field *cls = sf_batch_field(b, "cls");
  const sf_tensor *labels = cls && cls->tensor.ndim == 1 && cls->tensor.buffer &&
                                    (cls->tensor.dtype == SF_DTYPE_INT64 ||
                                     cls->tensor.dtype == SF_DTYPE_INT32) &&
                                    cls->tensor.shape[0] >= b->size
                                ? &cls->tensor
                                : NULL;
  int64_t n = f->tensor.shape[0] < MAX_TILES ? f->tensor.shape[0] : MAX_TILES;
  if (n <= 0) return 0;
  int64_t cols = (int64_t)ceil(sqrt((double)n)), rows = (n + cols - 1) / cols;
  int64_t th = l.h * SCALE, tw = l.w * SCALE, side = th > tw ? th : tw;
  if (side > MAX_SIDE) {
    th = th * MAX_SIDE / side > 0 ? th * MAX_SIDE / side : 1;
    tw = tw * MAX_SIDE / side > 0 ? tw * MAX_SIDE / side : 1;
  }
  int64_t cell_w = tw, cell_h = th + (labels ? LABEL_H : 0);
  canvas cv = {.w = cols * cell_w + (cols + 1) * GAP, .h = rows * cell_h + (rows + 1) * GAP};
  sf_tensor img;
  int64_t shape[3] = {cv.h, cv.w, 3};
  if (sf_tensor_alloc(&img, SF_DTYPE_UINT8, 3, shape) < 0) return SF_ENOMEM;
  cv.rgb = sf_tensor_data(&img);
  memset(cv.rgb, 40, (size_t)(cv.w * cv.h * 3)); /* dark grey gaps */
  for (int64_t i = 0; i < n; i++) {
    int64_t x0 = GAP + (i % cols) * (cell_w + GAP), y0 = GAP + (i / cols) * (cell_h + GAP);
    draw_image(&cv, &l, s, i, x0, y0, th, tw);
    if (labels) {
      const uint8_t *d = sf_tensor_data(labels);
      int64_t at = i * labels->strides[0];
      long long v;
      if (labels->dtype == SF_DTYPE_INT64) {
        int64_t x;
        memcpy(&x, d + at * 8, 8);
        v = x;
      } else {
        int32_t x;
        memcpy(&x, d + at * 4, 4);
        v = x;
      }
      char text[24];
      snprintf(text, sizeof text, "%lld", v);
      draw_text(&cv, x0, y0 + th + 1, cell_w, text);
    }
  }
  sf_buffer *png = NULL;
  sf_error err = {0};
  int r = sf_image_encode("png", &img, 0, &png, &err);
  sf_tensor_clear(&img);
  if (r < 0) return sf_node_error(node, r, path, NULL, -1, "preview: %s", err.message);
  FILE *out = fopen(path, "wb");
  size_t size = sf_buffer_size(png);
  bool ok = out && fwrite(sf_buffer_data(png), 1, size, out) == size;
  int saved = errno;
  if (out && fclose(out) != 0 && ok) {
    ok = false;
    saved = errno;
  }
  sf_buffer_unref(&png);
  if (!ok)
    return sf_node_error(node, SF_EIO, path, NULL, -1,
                         "cannot write preview_png %s: %s (check the directory exists and is "
                         "writable)",
                         path, strerror(saved));
  return 0;
}

static uint64_t batch_bytes(const sf_batch *b) {
  uint64_t n = 0;
  for (int i = 0; i < b->n_fields; i++) n += sf_tensor_nbytes(&b->fields[i].tensor);
  return n;
}

/* The field normalize works on: image_field, or the first uint8 [B,H,W,C] / [B,C,H,W] field; -1 if none. */
static int normalize_field(const device_sink *s, const sf_batch *b, bool *hwc) {
  for (int i = 0; i < b->n_fields; i++) {
    const sf_tensor *t = &b->fields[i].tensor;
    if (is_set(s->image_field) ? strcmp(b->fields[i].name, s->image_field) != 0
                               : t->ndim != 4 || t->dtype != SF_DTYPE_UINT8)
      continue;
    /* [B,C,H,W] when the second axis can be channels and the last cannot; else [B,H,W,C] */
    *hwc = t->ndim != 4 || !(t->shape[1] >= 1 && t->shape[1] <= 4 && (t->shape[3] < 1 || t->shape[3] > 4));
    return i;
  }
  return -1;
}

/* The per-channel tables of c channels for the kernel, from augment's (channel k uses mean[k], std[k]). */
static int channel_tables(sf_node *node, device_sink *s, const sf_field *f, int64_t c) {
  if (s->table_channels == c) return 0;
  if (s->mean.n && s->mean.n != c) { /* the graph's mistake, not a sample's: it stops the run */
    sf_node_error(node, SF_ESHAPE, NULL, NULL, -1,
                  "field '%s' has %lld channels but mean/std give %d values; give one value per channel",
                  f->name, (long long)c, s->mean.n);
    return SF_ESHAPE;
  }
  const sf_dtype dtype = s->normalize == NORMALIZE_FLOAT32 ? SF_DTYPE_FLOAT32 : SF_DTYPE_BFLOAT16;
  const size_t esize = sf_dtype_size(dtype);
  uint8_t *t = realloc(s->channel_tables, (size_t)c * 256 * esize);
  if (!t) return SF_ENOMEM;
  s->channel_tables = t;
  for (int64_t k = 0; k < c; k++) {
    const void *values = sf_image_tables_values(s->tables, dtype, (int)k);
    if (!values) return SF_EINTERNAL; /* the tables were made for these channels above */
    memcpy(t + (size_t)k * 256 * esize, values, 256 * esize);
  }
  s->table_channels = c;
  return 0;
}

/* The batch into GPU memory, in place (the host buffers go back to the batch stage's pool). */
static int to_device(sf_node *node, device_sink *s, sf_batch *b) {
  sf_device_normalize nm = {.field = -1};
  if (s->normalize != NORMALIZE_OFF) {
    nm.field = normalize_field(s, b, &nm.hwc);
    if (nm.field < 0) { /* the graph's mistake, not a sample's: it stops the run */
      sf_node_error(node, SF_ESHAPE, NULL, NULL, -1,
                    "normalize: the batch has no %s%s%s field to normalise; give augment dtype: uint8 (the GPU "
                    "then normalises), or set normalize: off",
                    is_set(s->image_field) ? "field '" : "uint8 [B,H,W,C] or [B,C,H,W]",
                    is_set(s->image_field) ? s->image_field : "", is_set(s->image_field) ? "'" : "");
      return SF_ESHAPE;
    }
    const sf_tensor *t = &b->fields[nm.field].tensor;
    int r = t->ndim == 4 ? channel_tables(node, s, &b->fields[nm.field], nm.hwc ? t->shape[3] : t->shape[1]) : 0;
    if (r < 0) return r;
    nm.dtype = s->normalize == NORMALIZE_FLOAT32 ? SF_DTYPE_FLOAT32 : SF_DTYPE_BFLOAT16;
    nm.tables = s->channel_tables;
  }
  sf_error e = {0};
  int r = sf_device_pool_move(s->pool, b, &nm, &e);
  /* Allocations, for stats: a steady run stops adding to them (the buffers are reused). */
  sf_device_pool_stats st;
  sf_device_pool_stats_get(s->pool, &st);
  sf_node_counter_add(node, "gpu_buffers_allocated", st.device_allocs - s->device_allocs);
  sf_node_counter_add(node, "pinned_buffers_allocated", st.pinned_allocs - s->pinned_allocs);
  s->device_allocs = st.device_allocs;
  s->pinned_allocs = st.pinned_allocs;
  if (r < 0) {
    sf_node_error(node, r, NULL, NULL, -1, "device %s: %s", s->device, e.message);
    return r; /* whatever the error policy: the trainer cannot get this batch on its GPU */
  }
  return 0;
}

static int step(sf_node *node) {
  device_sink *s = sf_node_priv(node);
  /* prefetch batches on the GPU that the trainer has not taken: wait (the pool wakes the node). */
  if (s->pool && sf_device_pool_ahead(s->pool) >= s->prefetch) return SF_EAGAIN;
  sf_item item;
  int r = sf_node_pop(node, &item);
  if (r < 0) return r;
  if (item.kind == SF_ITEM_BATCH) {
    sf_batch *b = item.u.batch;
    if (is_set(s->preview_png) && !s->preview_done) {
      s->preview_done = true;
      r = write_preview(node, s, b);
    }
    if (r == 0 && is_set(s->npy_dir) && !s->npy_off &&
        (s->npy_batches == 0 || b->index < (uint64_t)s->npy_batches))
      r = dump_npy(node, s, b);
    if (r == 0 && s->pool) r = to_device(node, s, b);
    if (r < 0) {
      sf_item_clear(&item);
      return r;
    }
    sf_node_count_output(node, 1, batch_bytes(b));
  }
  sf_node_push(node, &item);
  return 0;
}

const sf_stage_def sf_stage_device_sink = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "device_sink",
    .summary = "hands batches to the trainer, in host or GPU memory (device); optional .npy dumps and a labelled "
               "PNG preview grid",
    .inputs = SF_PORTS({"in", SF_PORT_BATCH}),
    .outputs = SF_PORTS({"out", SF_PORT_BATCH}),
    .priv_size = sizeof(device_sink),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
};
