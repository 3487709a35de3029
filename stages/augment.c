/* augment: resize, crops (padded random, center, random resized), flip, normalize, layout and dtype in one pass. */
#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_file.h"
#include "jpeg_region.h"
#include "normalize.h"
#include "pixels.h"
#include "recipe_source.h"
#include "resize.h"
#include "shardflow/stage.h"

enum { CROP_NONE, CROP_RANDOM, CROP_CENTER, CROP_RANDOM_RESIZED };
enum { LAYOUT_HWC, LAYOUT_CHW };
enum { OUT_UINT8, OUT_FLOAT32, OUT_BFLOAT16 };
/* Most channels an image may have here; decoded images have 1, 3 or 4. */
enum { MAX_CHANNELS = 16 };

typedef struct augment {
  /* options */
  sf_name_list fields;
  int crop;
  int64_t size;
  int64_t padding;
  sf_float_list scale;
  sf_float_list ratio;
  int64_t resize;
  double flip;
  sf_float_list mean;
  sf_float_list std;
  int layout;
  int dtype;
  bool dct_scaling;
  bool exact;             /* option: false = DCT scaling, fast IDCT and plain upsampling for deferred JPEGs */
  /* from init */
  char names[SF_MAX_FIELDS][SF_FIELD_NAME_MAX];
  int n_names;            /* 0: every decoded uint8 [H,W,C] field */
  double log_ratio[2];
  sf_buffer *luts;        /* a `luts`, shared with every recipe this node made */
} augment;

/*
 * Output value of every byte, per channel (only table 0 when there is no
 * mean/std). Immutable once init has filled it; deferred fields hold a
 * reference, as they may be written after this node is gone.
 */
typedef struct luts {
  uint8_t u8[256];
  float f32[8][256];
  uint16_t bf16[8][256];
  /* f32 of channels 0..2 as multiply-adds, when they give every entry (see normalize.h) */
  bool affine;
  sf_normalize rgb;
} luts;

static const char *const crop_names[] = {"none", "random", "center", "random_resized", NULL};
static const char *const layout_names[] = {"hwc", "chw", NULL};
static const char *const dtype_names[] = {"uint8", "float32", "bfloat16", NULL};

static const sf_option options[] = {
    {"fields", SF_OPT_NAME_LIST, offsetof(augment, fields), "", 0, 0,
     "comma-separated image fields to transform (\"\" = every decoded uint8 [H,W,C] field, and a uint16 one "
     "from decode's depth 16 is an error record; a listed "
     "field missing from a sample is an error); all fields of a sample get the same random draws, so "
     "an image and its mask stay aligned",
     NULL},
    {"crop", SF_OPT_ENUM, offsetof(augment, crop), "none", 0, 0,
     "crop: none, random (torchvision RandomCrop with padding), center (CenterCrop, zero-pads a "
     "small image) or random_resized (RandomResizedCrop: box from scale and ratio, resampled to size x "
     "size, PIL's antialiased bilinear as torchvision's default)",
     crop_names},
    {"size", SF_OPT_INT, offsetof(augment, size), "0", 0, 65536,
     "output side length in pixels for crops (0 = keep the image's height and width)", NULL},
    {"padding", SF_OPT_INT, offsetof(augment, padding), "0", 0, 65536,
     "zero pixels added on every side before a random or center crop (not materialised)", NULL},
    {"scale", SF_OPT_FLOAT_LIST, offsetof(augment, scale), "0.08,1.0", 0, 0,
     "random_resized: range of the crop's area as a fraction of the image (min,max)", NULL},
    {"ratio", SF_OPT_FLOAT_LIST, offsetof(augment, ratio), "0.75,1.3333333", 0, 0,
     "random_resized: range of the crop's width/height aspect ratio (min,max), drawn log-uniform",
     NULL},
    {"resize", SF_OPT_INT, offsetof(augment, resize), "0", 0, 65536,
     "resize so the shorter side has this many pixels, keeping the aspect ratio, before cropping "
     "(0 = off); antialiased bilinear exactly as PIL's Image.resize(BILINEAR), torchvision's default",
     NULL},
    {"flip", SF_OPT_FLOAT, offsetof(augment, flip), "0", 0, 1,
     "probability of a horizontal flip (0..1)", NULL},
    {"mean", SF_OPT_FLOAT_LIST, offsetof(augment, mean), "", 0, 0,
     "per-channel mean subtracted after scaling to 0..1 (empty = no normalisation)", NULL},
    {"std", SF_OPT_FLOAT_LIST, offsetof(augment, std), "", 0, 0,
     "per-channel standard deviation divided by after subtracting mean (same length as mean)", NULL},
    {"layout", SF_OPT_ENUM, offsetof(augment, layout), "chw", 0, 0,
     "output layout: hwc ([H,W,C]) or chw ([C,H,W])", layout_names},
    {"dtype", SF_OPT_ENUM, offsetof(augment, dtype), "float32", 0, 0,
     "output type: uint8 (pixel values kept), float32 (x/255, then normalised) or bfloat16 (the "
     "float32 rounded to nearest even)",
     dtype_names},
    {"exact", SF_OPT_BOOL, offsetof(augment, exact), "true", 0, 0,
     "true: a JPEG decode left undecoded gets the full decode's pixels (PIL's, bit for bit); false: its crop "
     "is decoded at the smallest DCT scale that covers the output (dct_scaling), with libjpeg's fast integer "
     "IDCT and plain chroma upsampling: less CPU, pixels a few levels off (docs/data.md says how far)",
     NULL},
    {"dct_scaling", SF_OPT_BOOL, offsetof(augment, dct_scaling), "false", 0, 0,
     "for a JPEG decode left undecoded (its defer_jpeg): false decodes the crop's region at full size, so "
     "pixels equal the full decode's (PIL's) bit for bit; true decodes it at the smallest DCT scale (1/8, "
     "1/4, 1/2, 1) that still covers the output: less CPU on large photos, pixels no longer PIL's",
     NULL},
    {NULL},
};

/* bfloat16: the upper half of the float32, rounded to nearest even (inputs are finite). */
static inline uint16_t to_bf16(float v) {
  uint32_t bits;
  memcpy(&bits, &v, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

/* Copies `fields` into names: at most 16 names of at most 31 bytes. */
static int parse_fields(sf_node *node, augment *a) {
  for (int i = 0; i < a->fields.n; i++) {
    if (strlen(a->fields.v[i]) >= SF_FIELD_NAME_MAX || i >= SF_MAX_FIELDS)
      return sf_node_option_error(node, "fields", "lists too many or too long names (at most %d names of at most "
                                                  "%d characters)", SF_MAX_FIELDS, SF_FIELD_NAME_MAX - 1);
    snprintf(a->names[i], sizeof a->names[i], "%s", a->fields.v[i]);
  }
  a->n_names = a->fields.n;
  return 0;
}

static void recipe_write(const sf_field_recipe *base, void *dst);
static const void *recipe_source(const sf_field_recipe *base, size_t *size);

static int init(sf_node *node) {
  augment *a = sf_node_priv(node);
  sf_recipe_source_register(recipe_write, recipe_source, NULL); /* shuffle prefetches what a recipe will read */
  int r = parse_fields(node, a);
  if (r < 0) return r;
  if (a->mean.n != a->std.n)
    return sf_node_option_error(node, NULL, "mean and std must have the same length (one value per channel)");
  for (int i = 0; i < a->std.n; i++)
    if (!(a->std.v[i] > 0))
      return sf_node_option_error(node, NULL, "std values must be positive");
  /* decode gives 1 (gray), 3 (rgb) or 4 (keep, with alpha) channels: another count matches no image. */
  if (a->mean.n && a->mean.n != 1 && a->mean.n != 3 && a->mean.n != 4)
    return sf_node_option_error(node, NULL, "mean and std have %d values, but decoded images have 1 (gray), 3 "
                                            "(rgb) or 4 (rgba) channels: give one value per channel", a->mean.n);
  if (a->mean.n > 0 && a->dtype == OUT_UINT8)
    return sf_node_option_error(node, NULL, "mean/std need a float output: use dtype float32 or bfloat16, "
                                            "or drop mean and std for dtype uint8");
  if (a->crop == CROP_RANDOM_RESIZED) {
    if (a->scale.n != 2 || !(a->scale.v[0] > 0) || a->scale.v[0] > a->scale.v[1])
      return sf_node_option_error(node, NULL, "scale must be two area fractions min,max with 0 < min <= max, "
                                              "e.g. 0.08,1.0");
    if (a->ratio.n != 2 || !(a->ratio.v[0] > 0) || a->ratio.v[0] > a->ratio.v[1])
      return sf_node_option_error(node, NULL, "ratio must be two aspect ratios min,max with 0 < min <= "
                                              "max, e.g. 0.75,1.3333333");
    if (a->padding > 0)
      return sf_node_option_error(node, NULL, "padding applies to crop random or center, not "
                                              "random_resized; set padding 0");
    a->log_ratio[0] = log(a->ratio.v[0]);
    a->log_ratio[1] = log(a->ratio.v[1]);
  }
  /* x/255, then (x - mean)/std, in double and rounded once: the direct path's tables. */
  a->luts = sf_buffer_new(sizeof(luts));
  if (!a->luts) return SF_ENOMEM;
  luts *l = (luts *)sf_buffer_data(a->luts);
  for (int x = 0; x < 256; x++) l->u8[x] = (uint8_t)x;
  for (int c = 0; c < (a->mean.n ? a->mean.n : 1); c++) {
    for (int x = 0; x < 256; x++) {
      double v = x / 255.0;
      if (a->mean.n) v = (v - a->mean.v[c]) / a->std.v[c];
      l->f32[c][x] = (float)v;
      l->bf16[c][x] = to_bf16((float)v);
    }
  }
  l->affine = true;
  for (int c = 0; c < 3; c++) {
    int t = c < a->mean.n ? c : 0;
    double mean = a->mean.n ? a->mean.v[t] : 0, std = a->mean.n ? a->std.v[t] : 1;
    l->rgb.scale[c] = 1.0 / (255.0 * std);
    l->rgb.shift[c] = -mean / std;
    l->affine = l->affine && sf_normalize_matches(l->f32[t], l->rgb.scale[c], l->rgb.shift[c]);
  }
  return 0;
}

static void uninit(sf_node *node) {
  augment *a = sf_node_priv(node);
  sf_buffer_unref(&a->luts);
}

/* ---- geometry: where every output pixel comes from ------------------------------------ */

/*
 * One axis of the output. Conceptually a source span [origin, origin+span) is
 * resampled to `scaled` pixels, zero-padded, and the window [pos, pos+n) of
 * that is taken (and mirrored when flipped on the x axis). When scaled ==
 * span the axis is a plain copy (no resampling).
 */
typedef struct axis {
  int64_t origin, span, scaled, pos, n;
} axis;

/* Python's round(): half to even, as torchvision's crop arithmetic uses it. */
static int64_t round_half_even(double v) { return (int64_t)nearbyint(v); }

/* torchvision CenterCrop offset within a (padded) extent, negative when it zero-pads. */
static int64_t center_offset(int64_t extent, int64_t n) {
  if (extent >= n) return round_half_even((double)(extent - n) / 2.0);
  return -((n - extent) / 2);
}

/* Shorter side to `target`, the longer truncated as torchvision Resize(int) does. */
static void resized_dims(int64_t h, int64_t w, int64_t target, int64_t *rh, int64_t *rw) {
  if (w <= h) {
    *rw = target;
    *rh = (int64_t)((double)(target * h) / (double)w);
  } else {
    *rh = target;
    *rw = (int64_t)((double)(target * w) / (double)h);
  }
}

/* RandomResizedCrop.get_params: top, left, height, width of the box. */
static void random_resized_box(const augment *a, sf_rng *rng, int64_t h, int64_t w, int64_t box[4]) {
  double area = (double)h * (double)w;
  for (int attempt = 0; attempt < 10; attempt++) {
    double target = area * (a->scale.v[0] + (a->scale.v[1] - a->scale.v[0]) * sf_rng_double(rng));
    double aspect = exp(a->log_ratio[0] + (a->log_ratio[1] - a->log_ratio[0]) * sf_rng_double(rng));
    int64_t bw = round_half_even(sqrt(target * aspect));
    int64_t bh = round_half_even(sqrt(target / aspect));
    if (bw > 0 && bw <= w && bh > 0 && bh <= h) {
      box[0] = (int64_t)sf_rng_below(rng, (uint64_t)(h - bh + 1));
      box[1] = (int64_t)sf_rng_below(rng, (uint64_t)(w - bw + 1));
      box[2] = bh;
      box[3] = bw;
      return;
    }
  }
  double in_ratio = (double)w / (double)h;
  int64_t bh = h, bw = w;
  if (in_ratio < a->ratio.v[0])
    bh = round_half_even((double)w / a->ratio.v[0]);
  else if (in_ratio > a->ratio.v[1])
    bw = round_half_even((double)h * a->ratio.v[1]);
  if (bh < 1) bh = 1;
  if (bh > h) bh = h;
  if (bw < 1) bw = 1;
  if (bw > w) bw = w;
  box[0] = (h - bh) / 2;
  box[1] = (w - bw) / 2;
  box[2] = bh;
  box[3] = bw;
}

/* ---- kernels ----------------------------------------------------------------------------- */

/* A prepared transform of one field: the kernels read nothing else. */
typedef struct job {
  const uint8_t *src;
  ptrdiff_t sy, sx, sc;         /* source strides in bytes */
  int c;
  int64_t oh, ow;
  /* source row/column of output (0,0), flip, and the rows/columns inside the image */
  int64_t top, left;
  bool flip;
  /* output rows [ya,yb) and columns [xa,xb) read the image, the rest is padding */
  int64_t ya, yb, xa, xb;
  void *out;
  ptrdiff_t oy, ox, oc;         /* output strides in elements */
  const void *lut[MAX_CHANNELS]; /* output value of each byte, per channel */
  const sf_normalize *rgb;       /* float32's lut[0..2] (bfloat16's before rounding) as multiply-adds, or NULL */
} job;

/*
 * The direct path (no resampling): crop, padding, flip, normalisation and
 * layout in one pass over the output. A byte's output value comes from its
 * channel's table (x/255, then (x - mean)/std, precomputed in init for all
 * 256 bytes), so the inner loop is loads and stores with no int-to-float
 * conversion (whose false dependency made a multiply-add loop 2x slower) and
 * no branch; padding is the table's value for 0. Three channels, the common
 * case, go pixel by pixel, or eight pixels at a time into CHW (and uint8 HWC) (FAST3).
 */
#define DEFINE_DIRECT(NAME, T, FAST3)                                                       \
  static void NAME(const job *j) {                                                          \
    const ptrdiff_t step = j->flip ? -j->sx : j->sx, ox = j->ox, oc = j->oc, sc = j->sc;    \
    const int64_t first = j->flip ? j->left + j->ow - 1 - j->xa : j->left + j->xa;          \
    const int64_t n = j->xb - j->xa;                                                        \
    const T *const *lut = (const T *const *)j->lut;                                         \
    for (int64_t y = 0; y < j->oh; y++) {                                                   \
      T *o = (T *)j->out + y * j->oy;                                                       \
      bool inside = y >= j->ya && y < j->yb;                                                \
      for (int c = 0; c < j->c; c++) {                                                      \
        T zero = lut[c][0], *oz = o + c * oc;                                               \
        for (int64_t x = 0; x < (inside ? j->xa : j->ow); x++) oz[x * ox] = zero;           \
        for (int64_t x = inside ? j->xb : j->ow; x < j->ow; x++) oz[x * ox] = zero;         \
      }                                                                                     \
      if (!inside) continue;                                                                \
      const uint8_t *q = j->src + (j->top + y) * j->sy + first * j->sx;                     \
      T *ov = o + j->xa * ox;                                                               \
      if (j->c == 3 && FAST3(j, q, step, n, ov)) {                                          \
      } else if (j->c == 3) {                                                               \
        const T *l0 = lut[0], *l1 = lut[1], *l2 = lut[2];                                   \
        for (int64_t i = 0; i < n; i++, q += step, ov += ox) {                              \
          ov[0] = l0[q[0]];                                                                 \
          ov[oc] = l1[q[sc]];                                                               \
          ov[2 * oc] = l2[q[2 * sc]];                                                       \
        }                                                                                   \
      } else {                                                                              \
        for (int c = 0; c < j->c; c++)                                                      \
          for (int64_t i = 0; i < n; i++) ov[c * oc + i * ox] = lut[c][q[c * sc + i * step]]; \
      }                                                                                     \
    }                                                                                       \
  }

/*
 * FAST3 of float32: three adjacent source channels into CHW planes go through
 * engine/codec/normalize.c (SIMD, the tables' values bit for bit) when it has
 * a SIMD path here. Returns whether it wrote the row.
 */
static bool rgb_f32(const job *j, const uint8_t *q, ptrdiff_t step, int64_t n, float *ov) {
  if (!j->rgb || j->ox != 1 || j->sc != 1) return false;
  float *const out[3] = {ov, ov + j->oc, ov + 2 * j->oc};
  return sf_normalize_rgb_f32(q, step, n, j->rgb, out);
}

/* FAST3 of uint8: three adjacent source channels into HWC or CHW, a copy or byte shuffles (normalize.c). */
static bool rgb_u8(const job *j, const uint8_t *q, ptrdiff_t step, int64_t n, uint8_t *ov) {
  if (j->sc != 1) return false;
  if (j->ox == 3 && j->oc == 1) return sf_normalize_rgb_u8(q, step, n, ov);
  uint8_t *const out[3] = {ov, ov + j->oc, ov + 2 * j->oc};
  return j->ox == 1 && sf_normalize_rgb_u8_planes(q, step, n, out);
}

/* FAST3 of bfloat16: as float32's, each value then rounded to bfloat16 as the tables are. */
static bool rgb_bf16(const job *j, const uint8_t *q, ptrdiff_t step, int64_t n, uint16_t *ov) {
  if (!j->rgb || j->ox != 1 || j->sc != 1) return false;
  uint16_t *const out[3] = {ov, ov + j->oc, ov + 2 * j->oc};
  return sf_normalize_rgb_bf16(q, step, n, j->rgb, out);
}

DEFINE_DIRECT(direct_u8, uint8_t, rgb_u8)
DEFINE_DIRECT(direct_f32, float, rgb_f32)
DEFINE_DIRECT(direct_bf16, uint16_t, rgb_bf16)

static void (*const direct_kernel[])(const job *) = {direct_u8, direct_f32, direct_bf16};

/*
 * Output indices [*first, *last) whose window position lies inside the scaled
 * extent; the rest is padding. Flipping mirrors the window, not the range test.
 */
static void valid_range(const axis *ax, bool flip, int64_t *first, int64_t *last) {
  int64_t lo = -ax->pos, hi = ax->scaled - ax->pos; /* window index k valid in [lo, hi) */
  if (flip) {
    int64_t l = ax->n - hi, h = ax->n - lo;         /* x = n-1-k */
    lo = l;
    hi = h;
  }
  *first = lo < 0 ? 0 : lo > ax->n ? ax->n : lo;
  *last = hi > ax->n ? ax->n : hi < *first ? *first : hi;
}

/* Fills the job's geometry (everything but src, strides and out) for axes ay/ax, which must not resample. */
static void place(job *j, const axis *ay, const axis *ax) {
  j->oh = ay->n;
  j->ow = ax->n;
  valid_range(ay, false, &j->ya, &j->yb);
  valid_range(ax, j->flip, &j->xa, &j->xb);
  j->top = ay->origin + ay->pos;
  j->left = ax->origin + ax->pos;
}

/* The resize of an axis's output window: its scaled indices [pos, pos+n) clipped to [0, scaled). */
static sf_resize_axis resize_axis(const axis *x) {
  int64_t lo = x->pos < 0 ? 0 : x->pos, hi = x->pos + x->n < x->scaled ? x->pos + x->n : x->scaled;
  if (hi <= lo) lo = 0, hi = 1; /* all padding: resample one pixel, never read */
  return (sf_resize_axis){x->origin, x->span, x->scaled, lo, hi - lo};
}

/*
 * Resamples the part of axes ay/ax that the output window reads (PIL's antialiased bilinear,
 * engine/codec/resize.c) into *out, a new pooled uint8 [H,W,C] tensor (the caller clears it), points j's
 * source at it and makes ay/ax plain windows of it. A no-op (out untouched) when neither axis
 * resamples. Returns 0 or SF_ENOMEM.
 */
static int resample(job *j, axis *ay, axis *ax, sf_tensor *out) {
  if (ay->scaled == ay->span && ax->scaled == ax->span) return 0;
  axis *axes[2] = {ay, ax};
  sf_resize_axis ra[2] = {resize_axis(ay), resize_axis(ax)};
  int r = sf_pixels_alloc(out, SF_DTYPE_UINT8, ra[0].n, ra[1].n, j->c); /* pooled: no page faults */
  if (r < 0) return r;
  if ((r = sf_resize_u8(j->src, j->sy, j->sx, j->sc, j->c, &ra[0], &ra[1], sf_tensor_data(out))) < 0) {
    sf_tensor_clear(out);
    return r;
  }
  j->src = sf_tensor_data(out);
  j->sy = ra[1].n * j->c;
  j->sx = j->c;
  j->sc = 1;
  for (int i = 0; i < 2; i++)
    *axes[i] = (axis){0, ra[i].n, ra[i].n, axes[i]->pos - ra[i].first, axes[i]->n};
  return 0;
}

/* Writes a placed job's output into j->out (strides oy/ox/oc). */
static void execute(const job *j, int dtype) { direct_kernel[dtype](j); }

/* Runs one placed-now transform into j->out (already allocated with strides oy/ox/oc). */
static void run(job *j, const axis *ay, const axis *ax, int dtype) {
  place(j, ay, ax);
  execute(j, dtype);
}

/* ---- deferred output: the transform runs later, into the batch's slot ------------------------ */

/*
 * A placed job and the references that keep what it reads alive: the source
 * image (j.src points into it) and the tables (j.lut points into them).
 * j.out is set by each write.
 */
typedef struct recipe {
  sf_field_recipe base;
  job j;
  int dtype;
  sf_tensor src;
  sf_buffer *luts;
} recipe;

static void recipe_write(const sf_field_recipe *base, void *dst) {
  const recipe *rc = (const recipe *)base;
  job j = rc->j;
  j.out = dst;
  execute(&j, rc->dtype);
}

/* The source bytes the job reads: from its first row's first pixel to its last row's last (a prefetch hint). */
static const void *recipe_source(const sf_field_recipe *base, size_t *size) {
  const job *j = &((const recipe *)base)->j;
  *size = 0;
  if (j->yb <= j->ya || j->xb <= j->xa) return NULL;
  int64_t from = j->flip ? j->left + j->ow - j->xb : j->left + j->xa; /* columns read: [from, from + n) */
  const uint8_t *first = j->src + (j->top + j->ya) * j->sy + from * j->sx;
  const uint8_t *end = j->src + (j->top + j->yb - 1) * j->sy + (from + j->xb - j->xa) * j->sx;
  *size = (size_t)(end - first);
  return first;
}

static void recipe_destroy(sf_field_recipe *base) {
  recipe *rc = (recipe *)base;
  sf_tensor_clear(&rc->src);
  sf_buffer_unref(&rc->luts);
  free(rc);
}

/*
 * Makes f a deferred field that runs j (everything set but its geometry and
 * out) over src. Returns 0 or SF_ENOMEM (f untouched).
 */
static int defer(sf_field *f, const job *j, const axis *ay, const axis *ax, int dtype, const sf_tensor *src,
                 sf_buffer *tables, const int64_t shape[3]) {
  static const sf_dtype out_dtype[] = {SF_DTYPE_UINT8, SF_DTYPE_FLOAT32, SF_DTYPE_BFLOAT16};
  recipe *rc = malloc(sizeof *rc);
  if (!rc) return SF_ENOMEM;
  rc->base.write = recipe_write;
  rc->base.destroy = recipe_destroy;
  rc->j = *j;
  rc->dtype = dtype;
  place(&rc->j, ay, ax);
  sf_tensor_ref(&rc->src, src);
  rc->luts = sf_buffer_ref(tables);
  return sf_field_defer(f, out_dtype[dtype], 3, shape, &rc->base); /* a valid shape: cannot fail */
}

/* ---- per field ----------------------------------------------------------------------------- */

/* A decoded uint8 [H,W,C] image, possibly deferred (another augment's output). */
static bool is_image(const sf_field *f) {
  return !f->encoded && f->tensor.dtype == SF_DTYPE_UINT8 && f->tensor.ndim == 3 &&
         (f->tensor.buffer || f->recipe);
}

/* A decoded uint16 [H,W,C] image (decode's depth 16 or native): refused with a record, not passed
   through untransformed next to transformed uint8 ones (one sample uncropped in a batch of crops). */
static bool is_uint16_image(const sf_field *f) {
  return !f->encoded && f->tensor.dtype == SF_DTYPE_UINT16 && f->tensor.ndim == 3 && (f->tensor.buffer || f->recipe);
}

static bool selected(const augment *a, const sf_field *f) {
  if (a->n_names == 0) return is_image(f) || is_uint16_image(f);
  for (int i = 0; i < a->n_names; i++)
    if (strcmp(a->names[i], f->name) == 0) return true;
  return false;
}

typedef struct field_error {
  int code;
  char message[256];
} field_error;

#define FAIL(e, c, ...) (snprintf((e)->message, sizeof (e)->message, __VA_ARGS__), (e)->code = (c))

/* ---- JPEG region decode (decode's defer_jpeg) ------------------------------------------------ */

/* A box edge at DCT scale m/8, rounded to the nearest pixel, at most limit. */
static int64_t scaled_edge(int64_t v, int m, int64_t limit) {
  int64_t s = (v * m + 4) / 8;
  return s < limit ? s : limit;
}

/* Decodes rect of f's JPEG at scale m/8 into *region; a corrupt JPEG is the field's error. */
static int decode_region(const sf_jpeg_source *jpeg, int m, bool fast, const int64_t rect[4], const sf_field *f,
                         sf_tensor *region, int64_t *x0, field_error *e) {
  sf_error err = {.code = 0};
  int r = sf_jpeg_decode_region(jpeg, m, fast, rect, region, x0, &err);
  if (r == SF_ENOMEM || r == 0) return r;
  return FAIL(e, r, "field '%s': %.200s", f->name, err.message);
}

/*
 * A deferred JPEG this augment does not crop (not in its `fields`, or `crop: none` without `resize`): decoded
 * whole here, with the full decode's pixels, so that a corrupt one is this stage's error record, not black
 * pixels where the batch writes it (the promise of SF_STAGE_TAKES_DEFERRED). Other fields: untouched.
 */
static int decode_whole(sf_field *f, field_error *e) {
  const sf_jpeg_source *jpeg = sf_jpeg_source_of(f);
  if (!jpeg) return 0;
  const int64_t rect[4] = {0, 0, jpeg->height, jpeg->width};
  sf_tensor pixels;
  int64_t x0;
  int r = decode_region(jpeg, 8, false, rect, f, &pixels, &x0, e);
  if (r < 0) return r;
  f->recipe->destroy(f->recipe);
  f->recipe = NULL;
  f->tensor = pixels; /* the header had no buffer to drop */
  return 0;
}

/*
 * Transforms one field in place of its tensor. rng is this sample's stream,
 * restarted for every field so same-sized fields get the same crop and flip.
 * The random draws happen here; the output is usually deferred (see defer()):
 * batch writes it straight into its slot, saving an allocation and a copy.
 * Returns 0, SF_ENOMEM, or a data error with *e filled.
 */
static int transform(const augment *a, sf_field *f, uint64_t stream, uint64_t *bytes, field_error *e) {
  const sf_tensor *in = &f->tensor;
  if (is_uint16_image(f))
    return FAIL(e, SF_EINVAL, "field '%s' is a uint16 image (decode's depth 16 or native); augment transforms "
                "uint8 images only: set decode's `depth: 8`, or leave the field out of augment's `fields`",
                f->name);
  if (!is_image(f))
    return FAIL(e, SF_ESHAPE, "field '%s' is not a decoded uint8 [H,W,C] image (%s, %d dimensions%s); "
                "decode it first or leave it out of `fields`", f->name, sf_dtype_name(in->dtype), in->ndim,
                f->encoded ? ", still encoded" : "");
  int64_t h = in->shape[0], w = in->shape[1], c = in->shape[2];
  if (h < 1 || w < 1 || c < 1 || c > MAX_CHANNELS)
    return FAIL(e, SF_ESHAPE, "field '%s' has shape [%lld,%lld,%lld]; augment needs a non-empty image "
                "with 1..%d channels", f->name, (long long)h, (long long)w, (long long)c, MAX_CHANNELS);
  if (a->mean.n && a->mean.n != c)
    return FAIL(e, SF_ESHAPE, "field '%s' has %lld channels but mean/std give %d values; give one value "
                "per channel", f->name, (long long)c, a->mean.n);
  /* A JPEG that decode left undecoded (defer_jpeg): decode only what the crop or resize reads. */
  bool regional = a->crop == CROP_RANDOM_RESIZED ? a->resize == 0 : a->crop != CROP_NONE || a->resize > 0;
  const sf_jpeg_source *jpeg = regional ? sf_jpeg_source_of(f) : NULL;
  int r = jpeg ? 0 : decode_whole(f, e);
  if (r == 0 && !jpeg) r = sf_field_materialize(f); /* a deferred input: an earlier augment's output */
  if (r < 0) return r;
  const luts *l = (const luts *)sf_buffer_data(a->luts);

  sf_rng rng;
  sf_rng_seed(&rng, stream);
  job j = {.src = jpeg ? NULL : sf_tensor_data(in), .sy = in->strides[0], .sx = in->strides[1], .sc = in->strides[2],
           .c = (int)c};
  sf_tensor pixels = {0}; /* the source when not f->tensor: a decoded JPEG region or a resampled image */
  /* Resize: the shorter side to `resize`; an identity resize stays on the direct path. */
  int64_t rh = h, rw = w;
  if (a->resize > 0) resized_dims(h, w, a->resize, &rh, &rw);
  if (rh < 1 || rw < 1)
    return FAIL(e, SF_ESHAPE, "field '%s' of %lldx%lld pixels would resize to %lldx%lld; use a larger "
                "`resize`", f->name, (long long)h, (long long)w, (long long)rh, (long long)rw);
  axis ay = {0, h, rh, 0, rh}, ax = {0, w, rw, 0, rw};

  if (a->crop == CROP_RANDOM_RESIZED && (rh != h || rw != w)) {
    /* A box of the resized image is resampled again: materialise the resize (uint8, as torchvision). */
    if ((r = resample(&j, &ay, &ax, &pixels)) < 0) return r;
    h = rh, w = rw;
  }

  int64_t oh = a->size ? a->size : rh, ow = a->size ? a->size : rw;
  switch (a->crop) {
  case CROP_RANDOM: {
    int64_t ph = rh + 2 * a->padding, pw = rw + 2 * a->padding;
    if (ph < oh || pw < ow)
      return FAIL(e, SF_ESHAPE, "field '%s' is %lldx%lld pixels (with padding %lld) but the random crop "
                  "is %lldx%lld; raise `padding` or `resize`, or lower `size`", f->name, (long long)rh,
                  (long long)rw, (long long)a->padding, (long long)oh, (long long)ow);
    ay.pos = (int64_t)sf_rng_below(&rng, (uint64_t)(ph - oh + 1)) - a->padding;
    ax.pos = (int64_t)sf_rng_below(&rng, (uint64_t)(pw - ow + 1)) - a->padding;
    ay.n = oh;
    ax.n = ow;
    break;
  }
  case CROP_CENTER:
    ay.pos = center_offset(rh + 2 * a->padding, oh) - a->padding;
    ax.pos = center_offset(rw + 2 * a->padding, ow) - a->padding;
    ay.n = oh;
    ax.n = ow;
    break;
  case CROP_RANDOM_RESIZED: {
    int64_t box[4];
    random_resized_box(a, &rng, h, w, box);
    if (jpeg) {
      /* The box at the smallest DCT scale that still covers size, its edges rounded to whole pixels. */
      int m = a->dct_scaling || !a->exact ? sf_jpeg_dct_scale(box[2], box[3], oh, ow) : 8;
      int64_t sh = sf_jpeg_scaled(h, m), sw = sf_jpeg_scaled(w, m), x0;
      int64_t rect[4] = {scaled_edge(box[0], m, sh - 1), scaled_edge(box[1], m, sw - 1),
                         scaled_edge(box[0] + box[2], m, sh), scaled_edge(box[1] + box[3], m, sw)};
      if (rect[2] <= rect[0]) rect[2] = rect[0] + 1;
      if (rect[3] <= rect[1]) rect[3] = rect[1] + 1;
      if ((r = decode_region(jpeg, m, !a->exact, rect, f, &pixels, &x0, e)) < 0) return r;
      ay = (axis){0, rect[2] - rect[0], oh, 0, oh};
      ax = (axis){x0, rect[3] - rect[1], ow, 0, ow};
      break;
    }
    ay = (axis){box[0], box[2], oh, 0, oh};
    ax = (axis){box[1], box[3], ow, 0, ow};
    break;
  }
  default:
    break;
  }
  j.flip = a->flip > 0 && sf_rng_double(&rng) < a->flip;
  if (jpeg && a->crop != CROP_RANDOM_RESIZED) {
    /*
     * Resize from the smallest DCT scale that still covers it: the image at that scale is the
     * source, of which only the rows and columns the window's resize reads are decoded.
     */
    int m = a->resize > 0 && (a->dct_scaling || !a->exact) ? sf_jpeg_dct_scale(h, w, rh, rw) : 8;
    int64_t rect[4], x0;
    ay.span = sf_jpeg_scaled(h, m);
    ax.span = sf_jpeg_scaled(w, m);
    sf_resize_axis ry = resize_axis(&ay), rx = resize_axis(&ax);
    sf_resize_reads(&ry, &rect[0], &rect[2]);
    sf_resize_reads(&rx, &rect[1], &rect[3]);
    if ((r = decode_region(jpeg, m, !a->exact, rect, f, &pixels, &x0, e)) < 0) return r;
    ay.origin = -rect[0];
    ax.origin = x0 - rect[1];
  }
  if (jpeg) {
    j.src = sf_tensor_data(&pixels);
    j.sy = pixels.strides[0], j.sx = pixels.strides[1], j.sc = pixels.strides[2];
  }
  /* Resample the window's part of the image now (uint8); what follows is one direct pass. */
  sf_tensor window = {0};
  if ((r = resample(&j, &ay, &ax, &window)) < 0) {
    sf_tensor_clear(&pixels);
    return r;
  }
  if (window.buffer) {
    sf_tensor_clear(&pixels);
    pixels = window;
  }

  int64_t shape[3];
  if (a->layout == LAYOUT_CHW)
    shape[0] = c, shape[1] = ay.n, shape[2] = ax.n;
  else
    shape[0] = ay.n, shape[1] = ax.n, shape[2] = c;
  if (a->layout == LAYOUT_CHW)
    j.oc = ay.n * ax.n, j.oy = ax.n, j.ox = 1;
  else
    j.oc = 1, j.oy = ax.n * c, j.ox = c;
  /* Output values from the tables of init: x/255, then (x - mean)/std; uint8 keeps the pixel values. */
  for (int k = 0; k < c; k++) {
    int t = a->mean.n ? k : 0;
    j.lut[k] = a->dtype == OUT_UINT8 ? (const void *)l->u8
               : a->dtype == OUT_FLOAT32 ? (const void *)l->f32[t] : (const void *)l->bf16[t];
  }
  if (a->dtype != OUT_UINT8 && c == 3 && l->affine) j.rgb = &l->rgb;
  static const sf_dtype out_dtype[] = {SF_DTYPE_UINT8, SF_DTYPE_FLOAT32, SF_DTYPE_BFLOAT16};
  size_t out_bytes = (size_t)(shape[0] * shape[1] * shape[2]) * sf_dtype_size(out_dtype[a->dtype]);
  *bytes += out_bytes;
  /*
   * Defer unless the source is much larger than the output (a small crop of a
   * big image): a deferred field keeps its source alive for as long as it
   * sits in a shuffle buffer. A view of a mapped shard keeps only its own
   * bytes in memory (the rest of the mapping is page cache).
   */
  const sf_tensor *src = pixels.buffer ? &pixels : &f->tensor;
  size_t held = sf_buffer_is_file(src->buffer) ? sf_tensor_nbytes(src) : sf_buffer_size(src->buffer);
  if (held / 2 <= out_bytes) {
    r = defer(f, &j, &ay, &ax, a->dtype, src, a->luts, shape);
    sf_tensor_clear(&pixels);
    return r;
  }
  sf_tensor out;
  r = sf_tensor_alloc(&out, out_dtype[a->dtype], 3, shape);
  if (r < 0) {
    sf_tensor_clear(&pixels);
    return r;
  }
  j.out = sf_tensor_data(&out);
  run(&j, &ay, &ax, a->dtype);
  sf_tensor_clear(&pixels);
  if (f->recipe) f->recipe->destroy(f->recipe), f->recipe = NULL; /* the JPEG's, now decoded */
  sf_tensor_clear(&f->tensor);
  f->tensor = out;
  return 0;
}

static int map(sf_node *node, sf_sample **ps) {
  augment *a = sf_node_priv(node);
  sf_sample *s = *ps;
  uint64_t stream = sf_node_seed(node);
  stream = sf_seed_mix(stream, s->epoch);
  stream = sf_seed_mix(stream, s->pass);
  stream = sf_seed_mix(stream, s->shard_index);
  stream = sf_seed_mix(stream, s->index);

  uint64_t bytes = 0;
  field_error e = {0};
  for (int i = 0; i < a->n_names && !e.code; i++)
    if (!sf_sample_field(s, a->names[i]))
      FAIL(&e, SF_ENOENT, "sample has no field '%s' listed in augment's `fields`", a->names[i]);
  for (int i = 0; i < s->n_fields && !e.code; i++) {
    int r = selected(a, &s->fields[i]) ? transform(a, &s->fields[i], stream, &bytes, &e)
                                       : decode_whole(&s->fields[i], &e);
    if (r < 0 && !e.code) return r; /* out of memory: not the sample's fault, so no record; the pipeline stops */
  }
  if (e.code) {
    sf_node_error(node, e.code, sf_sample_url(s), s->key, s->offset, "%s", e.message);
    return e.code;
  }
  return 0;
}

const sf_stage_def sf_stage_augment = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "augment",
    .summary = "resize, crop (padded random, center, random resized), flip, normalize, HWC/CHW and "
               "dtype in one pass over the output",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP | SF_STAGE_TAKES_DEFERRED,
    .priv_size = sizeof(augment),
    .options = options,
    .init = init,
    .map = map,
    .uninit = uninit,
};
