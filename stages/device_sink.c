/* device_sink: the pipeline's last stage; hands batches to the trainer and optionally dumps .npy files and a preview grid. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "image.h"
#include "files.h"
#include "npy.h"
#include "shardflow/stage.h"

typedef struct device_sink {
  char *npy_dir;         /* option */
  int64_t npy_batches;   /* option */
  char *preview_png;     /* option */
  sf_float_list mean;    /* option */
  sf_float_list std;     /* option */
  char *image_field;     /* option */
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
     "per-channel mean the images were normalised with (0..1 units, as augment's mean), to undo "
     "it for the preview",
     NULL},
    {"std", SF_OPT_FLOAT_LIST, offsetof(device_sink, std), "", 0, 0,
     "per-channel standard deviation the images were normalised with (as augment's std)", NULL},
    {"image_field", SF_OPT_STRING, offsetof(device_sink, image_field), "", 0, 0,
     "batch field drawn in the preview (\"\" = the first [B,C,H,W], [B,H,W,C] or [B,H,W] field)",
     NULL},
    {NULL},
};

static bool is_set(const char *s) { return s && s[0]; }

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
  return 0;
}

/* mkdir -p: the dump directory may be several levels deep. */

/* Reports a failed debug write; under `skip` the batch still goes on and dumps stop. */
static int dump_error(sf_node *node, device_sink *s, const char *path, const char *what) {
  s->npy_off = true;
  return sf_node_error(node, SF_EIO, path, NULL, -1, "%s", what);
}

static int dump_npy(sf_node *node, device_sink *s, const sf_batch *b) {
  char path[4096], why[4800];
  if (!s->npy_ready) {
    int e = sf_make_dirs(s->npy_dir, false);
    if (e < 0) {
      snprintf(why, sizeof why, "cannot create npy_dir %s: %s (check the path and permissions)",
               s->npy_dir, strerror(-e));
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

static int step(sf_node *node) {
  device_sink *s = sf_node_priv(node);
  sf_item item;
  int r = sf_node_pop(node, &item);
  if (r < 0) return r;
  if (item.kind == SF_ITEM_BATCH) {
    const sf_batch *b = item.u.batch;
    if (is_set(s->preview_png) && !s->preview_done) {
      s->preview_done = true;
      r = write_preview(node, s, b);
    }
    if (r == 0 && is_set(s->npy_dir) && !s->npy_off &&
        (s->npy_batches == 0 || b->index < (uint64_t)s->npy_batches))
      r = dump_npy(node, s, b);
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
    .summary = "hands batches to the trainer; optional .npy dumps and a labelled PNG preview grid",
    .inputs = SF_PORTS({"in", SF_PORT_BATCH}),
    .outputs = SF_PORTS({"out", SF_PORT_BATCH}),
    .priv_size = sizeof(device_sink),
    .options = options,
    .init = init,
    .step = step,
};
