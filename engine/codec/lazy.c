/* Lazy fields (lazy.h): the built-in deferred kinds, their kernels and the one materialisation. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "buffer_file.h"
#include "lazy.h"
#include "log.h"
#include "pixels.h"
#include "resize.h"

/* ---- the clock ----------------------------------------------------------------------------------- */

struct sf_lazy_clock {
  atomic_uint_fast64_t refs, ns;
};

static _Thread_local uint64_t thread_ns;

sf_lazy_clock *sf_lazy_clock_new(void) {
  sf_lazy_clock *c = calloc(1, sizeof *c);
  if (c) atomic_init(&c->refs, 1);
  return c;
}

sf_lazy_clock *sf_lazy_clock_ref(sf_lazy_clock *c) {
  atomic_fetch_add(&c->refs, 1);
  return c;
}

void sf_lazy_clock_unref(sf_lazy_clock *c) {
  if (c && atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

void sf_lazy_clock_charge(sf_lazy_clock *c, uint64_t ns) {
  atomic_fetch_add_explicit(&c->ns, ns, memory_order_relaxed);
  thread_ns += ns;
}

uint64_t sf_lazy_clock_ns(const sf_lazy_clock *c) { return c ? atomic_load(&((sf_lazy_clock *)c)->ns) : 0; }

uint64_t sf_lazy_thread_ns(void) { return thread_ns; }

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* ---- kind 1: a JPEG left undecoded --------------------------------------------------------------- */

typedef struct jpeg_recipe {
  sf_field_recipe base;
  sf_jpeg_source src;
} jpeg_recipe;

static void jpeg_write(const sf_field_recipe *base, void *dst) {
  const sf_jpeg_source *s = &((const jpeg_recipe *)base)->src;
  sf_tensor image;
  sf_error error = {.code = 0};
  size_t n = (size_t)s->height * (size_t)s->width * (size_t)s->channels;
  /* write() cannot fail: a JPEG corrupt past its header (found only now) becomes black pixels and a
     log line. augment, the consumer this path is for, reports it as an error record instead. */
  if (sf_image_decode("jpg", s->bytes.buffer, s->bytes.offset, (size_t)s->bytes.shape[0], s->mode, &s->limits,
                      &image, &error) < 0 ||
      sf_tensor_nbytes(&image) != n) {
    sf_log(SF_LOG_WARNING, "decode", "deferred JPEG could not be decoded (%s); wrote black pixels",
           error.code ? error.message : "size changed");
    memset(dst, 0, n);
    sf_tensor_clear(&image);
    return;
  }
  memcpy(dst, sf_tensor_data(&image), n);
  sf_tensor_clear(&image);
}

static void jpeg_destroy(sf_field_recipe *base) {
  jpeg_recipe *r = (jpeg_recipe *)base;
  sf_tensor_clear(&r->src.bytes);
  free(r);
}

int sf_lazy_defer_jpeg(sf_field *f, sf_image_mode mode, const sf_image_limits *limits) {
  sf_jpeg_source src;
  if (!sf_jpeg_probe(&f->tensor, mode, limits, &src)) return 0;
  jpeg_recipe *r = malloc(sizeof *r);
  if (!r) {
    sf_tensor_clear(&src.bytes);
    return SF_ENOMEM;
  }
  *r = (jpeg_recipe){.base = {.write = jpeg_write, .destroy = jpeg_destroy}, .src = src};
  const int64_t shape[3] = {src.height, src.width, src.channels};
  return sf_field_defer(f, SF_DTYPE_UINT8, 3, shape, &r->base) < 0 ? SF_ENOMEM : 1;
}

const sf_jpeg_source *sf_lazy_jpeg_of(const sf_field *f) {
  return f->recipe && f->recipe->write == jpeg_write ? &((const jpeg_recipe *)f->recipe)->src : NULL;
}

int sf_lazy_decode_jpeg(sf_field *f, sf_error *error) {
  const sf_jpeg_source *jpeg = sf_lazy_jpeg_of(f);
  if (!jpeg) return 0;
  const int64_t rect[4] = {0, 0, jpeg->height, jpeg->width};
  sf_tensor pixels;
  int64_t x0;
  int r = sf_jpeg_decode_region(jpeg, 8, false, rect, &pixels, &x0, error);
  if (r < 0) return r;
  f->recipe->destroy(f->recipe);
  f->recipe = NULL;
  f->tensor = pixels; /* the header had no buffer to drop */
  return 0;
}

/* ---- kind 2: a transform still to apply ---------------------------------------------------------- */

/* bfloat16: the upper half of the float32, rounded to nearest even (inputs are finite). */
static inline uint16_t to_bf16(float v) {
  uint32_t bits;
  memcpy(&bits, &v, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}

sf_buffer *sf_lazy_tables_new(const double *mean, const double *std, int n) {
  sf_buffer *b = sf_buffer_new(sizeof(sf_lazy_tables));
  if (!b) return NULL;
  sf_lazy_tables *l = (sf_lazy_tables *)sf_buffer_data(b);
  l->n = n;
  for (int x = 0; x < 256; x++) l->u8[x] = (uint8_t)x;
  for (int c = 0; c < (n ? n : 1); c++) {
    for (int x = 0; x < 256; x++) {
      double v = x / 255.0;
      if (n) v = (v - mean[c]) / std[c];
      l->f32[c][x] = (float)v;
      l->bf16[c][x] = to_bf16((float)v);
    }
  }
  l->affine = true;
  for (int c = 0; c < 3; c++) {
    int t = c < n ? c : 0;
    double m = n ? mean[t] : 0, s = n ? std[t] : 1;
    l->rgb.scale[c] = 1.0 / (255.0 * s);
    l->rgb.shift[c] = -m / s;
    l->affine = l->affine && sf_normalize_matches(l->f32[t], l->rgb.scale[c], l->rgb.shift[c]);
  }
  return b;
}

/* ---- kernels ----------------------------------------------------------------------------------- */

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
  const void *lut[SF_LAZY_MAX_CHANNELS]; /* output value of each byte, per channel */
  const sf_normalize *rgb;       /* float32's lut[0..2] (bfloat16's before rounding) as multiply-adds, or NULL */
} job;

/*
 * Small padded outputs (CIFAR's random crop with padding 4): the window, padding included, as bytes in
 * scratch, so that the SIMD pass writes every output row once (no fill of the padding first, no second
 * write of the rows the image covers). Padding is byte 0, whose table value is the padding's value. Row
 * y of scratch is output row y; byte k of it is source column left + k (a flipped pass reads it from the
 * end). Only three adjacent channels (sx 3, sc 1), at most PAD_SCRATCH bytes. Returns whether it wrote
 * scratch and *w (j's copy reading it), false when the window has no padding or does not fit.
 */
enum { PAD_SCRATCH = 16384 };
static bool pad_window(const job *j, uint8_t *scratch, job *w) {
  const int64_t row = 3 * j->ow;
  bool padded = j->ya > 0 || j->yb < j->oh || j->xa > 0 || j->xb < j->ow;
  if (!padded || j->c != 3 || j->sx != 3 || j->sc != 1 || row * j->oh > PAD_SCRATCH) return false;
  memset(scratch, 0, (size_t)(row * j->oh));
  /* the columns k the output reads inside the image: x in [xa, xb), mirrored when flipped */
  const int64_t k0 = j->flip ? j->ow - j->xb : j->xa, k1 = j->flip ? j->ow - j->xa : j->xb;
  for (int64_t y = j->ya; y < j->yb && k1 > k0; y++)
    memcpy(scratch + y * row + 3 * k0, j->src + (j->top + y) * j->sy + (j->left + k0) * 3, (size_t)(3 * (k1 - k0)));
  *w = *j;
  w->src = scratch;
  w->sy = row;
  return true;
}

/*
 * The direct path (no resampling): crop, padding, flip, normalisation and
 * layout in one pass over the output. A byte's output value comes from its
 * channel's table (x/255, then (x - mean)/std, precomputed in init for all
 * 256 bytes), so the inner loop is loads and stores with no int-to-float
 * conversion (whose false dependency made a multiply-add loop 2x slower) and
 * no branch; padding is the table's value for 0. Three channels, the common
 * case, go as one block of rows to FAST3 (eight pixels at a time into CHW, and
 * uint8 HWC), else pixel by pixel.
 */
#define DEFINE_DIRECT(NAME, T, FAST3)                                                       \
  static void NAME(const job *j) {                                                          \
    const ptrdiff_t step = j->flip ? -j->sx : j->sx, ox = j->ox, oc = j->oc, sc = j->sc;    \
    const int64_t first = j->flip ? j->left + j->ow - 1 - j->xa : j->left + j->xa;          \
    const int64_t n = j->xb - j->xa;                                                        \
    const T *const *lut = (const T *const *)j->lut;                                         \
    uint8_t scratch[PAD_SCRATCH];                                                           \
    job w;                                                                                  \
    if (pad_window(j, scratch, &w) &&                                                       \
        FAST3(&w, j->flip ? scratch + 3 * (j->ow - 1) : scratch, j->flip ? -3 : 3, j->ow, j->oh, \
              (T *)j->out))                                                                 \
      return;                                                                               \
    if (ox == 1 && j->oy == j->ow) {                                                        \
      /* CHW: padding rows are runs of each plane; padding columns fill the plane first */  \
      const bool cols = j->xa > 0 || j->xb < j->ow;                                         \
      for (int c = 0; c < j->c; c++) {                                                      \
        T zero = lut[c][0], *plane = (T *)j->out + c * oc;                                  \
        const int64_t top = cols ? j->oh * j->ow : j->ya * j->ow, bottom = j->yb * j->ow;   \
        for (int64_t i = 0; i < top; i++) plane[i] = zero;                                  \
        for (int64_t i = cols ? j->oh * j->ow : bottom; i < j->oh * j->ow; i++)             \
          plane[i] = zero;                                                                  \
      }                                                                                     \
    } else {                                                                                \
      for (int64_t y = 0; y < j->oh; y++) {                                                 \
        T *o = (T *)j->out + y * j->oy;                                                     \
        bool inside = y >= j->ya && y < j->yb;                                              \
        for (int c = 0; c < j->c; c++) {                                                    \
          T zero = lut[c][0], *oz = o + c * oc;                                             \
          for (int64_t x = 0; x < (inside ? j->xa : j->ow); x++) oz[x * ox] = zero;         \
          for (int64_t x = inside ? j->xb : j->ow; x < j->ow; x++) oz[x * ox] = zero;       \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
    if (j->yb <= j->ya || n <= 0) return;                                                   \
    const uint8_t *q0 = j->src + (j->top + j->ya) * j->sy + first * j->sx;                  \
    T *o0 = (T *)j->out + j->ya * j->oy + j->xa * ox;                                       \
    if (j->c == 3 && FAST3(j, q0, step, n, j->yb - j->ya, o0)) return;                      \
    for (int64_t y = 0; y < j->yb - j->ya; y++) {                                           \
      const uint8_t *q = q0 + y * j->sy;                                                    \
      T *ov = o0 + y * j->oy;                                                               \
      if (j->c == 3) {                                                                      \
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

/* The block of rows FAST3 writes: n pixels from q, `rows` rows, j's source and output row strides. */
static sf_rgb_rows rows_of(const job *j, const uint8_t *q, ptrdiff_t step, int64_t n, int64_t rows) {
  return (sf_rgb_rows){.q = q, .sy = j->sy, .step = step, .n = n, .rows = rows, .oy = j->oy};
}

/*
 * FAST3 of float32: three adjacent source channels into CHW planes go through
 * engine/codec/normalize.c (SIMD, the tables' values bit for bit) when it has
 * a SIMD path here. Returns whether it wrote the rows.
 */
static bool rgb_f32(const job *j, const uint8_t *q, ptrdiff_t step, int64_t n, int64_t rows, float *ov) {
  if (!j->rgb || j->ox != 1 || j->sc != 1) return false;
  float *const out[3] = {ov, ov + j->oc, ov + 2 * j->oc};
  sf_rgb_rows b = rows_of(j, q, step, n, rows);
  return sf_normalize_rgb_f32(&b, j->rgb, out);
}

/* FAST3 of uint8: three adjacent source channels into HWC or CHW, a copy or byte shuffles (normalize.c). */
static bool rgb_u8(const job *j, const uint8_t *q, ptrdiff_t step, int64_t n, int64_t rows, uint8_t *ov) {
  if (j->sc != 1) return false;
  sf_rgb_rows b = rows_of(j, q, step, n, rows);
  if (j->ox == 3 && j->oc == 1) return sf_normalize_rgb_u8(&b, ov);
  uint8_t *const out[3] = {ov, ov + j->oc, ov + 2 * j->oc};
  return j->ox == 1 && sf_normalize_rgb_u8_planes(&b, out);
}

/* FAST3 of bfloat16: as float32's, each value then rounded to bfloat16 as the tables are. */
static bool rgb_bf16(const job *j, const uint8_t *q, ptrdiff_t step, int64_t n, int64_t rows, uint16_t *ov) {
  if (!j->rgb || j->ox != 1 || j->sc != 1) return false;
  uint16_t *const out[3] = {ov, ov + j->oc, ov + 2 * j->oc};
  sf_rgb_rows b = rows_of(j, q, step, n, rows);
  return sf_normalize_rgb_bf16(&b, j->rgb, out);
}

DEFINE_DIRECT(direct_u8, uint8_t, rgb_u8)
DEFINE_DIRECT(direct_f32, float, rgb_f32)
DEFINE_DIRECT(direct_bf16, uint16_t, rgb_bf16)

static void (*const direct_kernel[])(const job *) = {direct_u8, direct_f32, direct_bf16};

/*
 * Output indices [*first, *last) whose window position lies inside the scaled
 * extent; the rest is padding. Flipping mirrors the window, not the range test.
 */
static void valid_range(const sf_lazy_axis *ax, bool flip, int64_t *first, int64_t *last) {
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
static void place(job *j, const sf_lazy_axis *ay, const sf_lazy_axis *ax) {
  j->oh = ay->n;
  j->ow = ax->n;
  valid_range(ay, false, &j->ya, &j->yb);
  valid_range(ax, j->flip, &j->xa, &j->xb);
  j->top = ay->origin + ay->pos;
  j->left = ax->origin + ax->pos;
}

/* The resize of an axis's output window: its scaled indices [pos, pos+n) clipped to [0, scaled). */
static sf_resize_axis resize_axis(const sf_lazy_axis *x) {
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
static int resample(job *j, sf_lazy_axis *ay, sf_lazy_axis *ax, sf_tensor *out) {
  if (ay->scaled == ay->span && ax->scaled == ax->span) return 0;
  sf_lazy_axis *axes[2] = {ay, ax};
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
    *axes[i] = (sf_lazy_axis){0, ra[i].n, ra[i].n, axes[i]->pos - ra[i].first, axes[i]->n};
  return 0;
}


/* The kernel of an output dtype (direct_kernel's index). */
static int kernel_of(sf_dtype dtype) { return dtype == SF_DTYPE_UINT8 ? 0 : dtype == SF_DTYPE_FLOAT32 ? 1 : 2; }

void sf_lazy_shape(const sf_lazy_transform *t, int64_t shape[3]) {
  if (t->layout == SF_LAZY_CHW)
    shape[0] = t->channels, shape[1] = t->y.n, shape[2] = t->x.n;
  else
    shape[0] = t->y.n, shape[1] = t->x.n, shape[2] = t->channels;
}

static size_t output_bytes(const sf_lazy_transform *t) {
  return (size_t)(t->y.n * t->x.n * t->channels) * sf_dtype_size(t->dtype);
}

/* A job reading t's view src (no JPEG) with t's geometry, tables and output strides; out unset. */
static void compile(job *j, const sf_lazy_transform *t) {
  const sf_lazy_tables *l = (const sf_lazy_tables *)sf_buffer_data(t->tables);
  *j = (job){.src = sf_tensor_data(&t->src), .sy = t->src.strides[0], .sx = t->src.strides[1],
             .sc = t->src.strides[2], .c = t->channels, .flip = t->flip};
  place(j, &t->y, &t->x);
  if (t->layout == SF_LAZY_CHW)
    j->oc = t->y.n * t->x.n, j->oy = t->x.n, j->ox = 1;
  else
    j->oc = 1, j->oy = t->x.n * t->channels, j->ox = t->channels;
  /* Output values from the tables: x/255, then (x - mean)/std; uint8 keeps the pixel values. */
  for (int k = 0; k < t->channels; k++) {
    int c = l->n ? k : 0;
    j->lut[k] = t->dtype == SF_DTYPE_UINT8     ? (const void *)l->u8
                : t->dtype == SF_DTYPE_FLOAT32 ? (const void *)l->f32[c]
                                               : (const void *)l->bf16[c];
  }
  if (t->dtype != SF_DTYPE_UINT8 && t->channels == 3 && l->affine) j->rgb = &l->rgb;
}

/*
 * *p = t with its JPEG region decoded and its resampling done: a view (into *pixels, a new tensor the
 * caller clears, or t's own src) read by one direct pass. Returns 0, SF_ENOMEM or SF_EFORMAT.
 */
static int prepare(const sf_lazy_transform *t, sf_lazy_transform *p, sf_tensor *pixels, sf_error *error) {
  *p = *t;
  memset(pixels, 0, sizeof *pixels);
  int r;
  if (t->jpeg) {
    int64_t x0;
    sf_error scratch = {.code = 0};
    if ((r = sf_jpeg_decode_region(t->jpeg, t->m, t->fast, t->rect, pixels, &x0, error ? error : &scratch)) < 0)
      return r;
    /* The region's row 0 is the image's row rect[0], its column x0 the image's column rect[1]. */
    p->jpeg = NULL;
    p->src = *pixels;
    p->y.origin -= t->rect[0];
    p->x.origin -= t->rect[1] - x0;
  }
  job j = {.src = sf_tensor_data(&p->src), .sy = p->src.strides[0], .sx = p->src.strides[1],
           .sc = p->src.strides[2], .c = p->channels};
  sf_tensor window = {0};
  if ((r = resample(&j, &p->y, &p->x, &window)) < 0) {
    sf_tensor_clear(pixels);
    return r;
  }
  if (window.buffer) {
    sf_tensor_clear(pixels);
    *pixels = window;
    p->src = window;
  }
  return 0;
}

int sf_lazy_write(const sf_lazy_transform *t, void *dst, sf_error *error) {
  uint64_t start = t->clock ? now_ns() : 0;
  sf_lazy_transform p;
  sf_tensor pixels;
  int r = prepare(t, &p, &pixels, error);
  if (r < 0) {
    memset(dst, 0, output_bytes(t));
    return r;
  }
  job j;
  compile(&j, &p);
  j.out = dst;
  direct_kernel[kernel_of(p.dtype)](&j);
  sf_tensor_clear(&pixels);
  if (t->clock) sf_lazy_clock_charge(t->clock, now_ns() - start);
  return 0;
}

/*
 * A deferred transform: a prepared description (a view, no resampling) and the references that keep
 * what it reads alive (its src and tables, and its clock).
 */
typedef struct transform_recipe {
  sf_field_recipe base;
  sf_lazy_transform t;
} transform_recipe;

static void transform_write(const sf_field_recipe *base, void *dst) {
  sf_lazy_write(&((const transform_recipe *)base)->t, dst, NULL); /* prepared: cannot fail */
}

static void transform_destroy(sf_field_recipe *base) {
  transform_recipe *rc = (transform_recipe *)base;
  sf_tensor_clear(&rc->t.src);
  sf_buffer_unref(&rc->t.tables);
  sf_lazy_clock_unref(rc->t.clock);
  free(rc);
}

const sf_lazy_transform *sf_lazy_transform_of(const sf_field *f) {
  return f->recipe && f->recipe->write == transform_write ? &((const transform_recipe *)f->recipe)->t : NULL;
}

int sf_lazy_apply(sf_field *f, const sf_lazy_transform *t, sf_tensor *into, sf_error *error) {
  sf_lazy_transform p;
  sf_tensor pixels;
  int r = prepare(t, &p, &pixels, error);
  if (r < 0) {
    if (into) sf_tensor_clear(into);
    return r;
  }
  int64_t shape[3];
  sf_lazy_shape(&p, shape);
  size_t out_bytes = output_bytes(&p);
  /*
   * Defer unless the source is much larger than the output (a small crop of a big image): a deferred
   * field keeps its source alive for as long as it sits in a shuffle buffer. A view of a mapped shard
   * keeps only its own bytes in memory (the rest of the mapping is page cache).
   */
  size_t held = sf_buffer_is_file(p.src.buffer) ? sf_tensor_nbytes(&p.src) : sf_buffer_size(p.src.buffer);
  if (!into && held / 2 <= out_bytes) {
    transform_recipe *rc = malloc(sizeof *rc);
    if (!rc) {
      sf_tensor_clear(&pixels);
      return SF_ENOMEM;
    }
    rc->base = (sf_field_recipe){.write = transform_write, .destroy = transform_destroy};
    rc->t = p;
    rc->t.clock = NULL;
    sf_tensor_ref(&rc->t.src, &p.src); /* before the field drops its own tensor, which src may view */
    rc->t.tables = sf_buffer_ref(p.tables);
    sf_tensor_clear(&pixels);
    return sf_field_defer(f, p.dtype, 3, shape, &rc->base); /* a valid shape: cannot fail */
  }
  sf_tensor out;
  if (into) {
    out = *into;
    memset(into, 0, sizeof *into);
  } else if ((r = sf_tensor_alloc(&out, p.dtype, 3, shape)) < 0) {
    sf_tensor_clear(&pixels);
    return r;
  }
  p.clock = NULL; /* the caller's own time */
  sf_lazy_write(&p, sf_tensor_data(&out), NULL);
  sf_tensor_clear(&pixels);
  if (f->recipe) f->recipe->destroy(f->recipe), f->recipe = NULL; /* the JPEG's, now decoded */
  sf_tensor_clear(&f->tensor);
  f->tensor = out;
  return 0;
}

int sf_lazy_resize(const sf_tensor *src, int64_t h, int64_t w, sf_tensor *out) {
  job j = {.src = sf_tensor_data(src), .sy = src->strides[0], .sx = src->strides[1], .sc = src->strides[2],
           .c = (int)src->shape[2]};
  sf_lazy_axis ay = {0, src->shape[0], h, 0, h}, ax = {0, src->shape[1], w, 0, w};
  memset(out, 0, sizeof *out);
  return resample(&j, &ay, &ax, out);
}

void sf_lazy_reads(const sf_lazy_axis *a, int64_t *first, int64_t *end) {
  sf_resize_axis r = resize_axis(a);
  sf_resize_reads(&r, first, end);
}

/* ---- any field --------------------------------------------------------------------------------- */

bool sf_lazy_adopt(sf_field *f, sf_lazy_clock *clock) {
  if (!f->recipe) return false;
  if (f->recipe->write == jpeg_write) return true; /* augment decodes its crop itself: the time is augment's */
  if (f->recipe->write != transform_write) return false;
  transform_recipe *rc = (transform_recipe *)f->recipe;
  if (!rc->t.clock && clock) rc->t.clock = sf_lazy_clock_ref(clock);
  return true;
}

/* The source bytes the job reads: from its first row's first pixel to its last row's last (a prefetch hint). */
const void *sf_lazy_source(const sf_field *f, size_t *size) {
  *size = 0;
  const sf_lazy_transform *t = sf_lazy_transform_of(f);
  if (!t) return NULL;
  job jb;
  compile(&jb, t);
  const job *j = &jb;
  if (j->yb <= j->ya || j->xb <= j->xa) return NULL;
  int64_t from = j->flip ? j->left + j->ow - j->xb : j->left + j->xa; /* columns read: [from, from + n) */
  const uint8_t *first = j->src + (j->top + j->ya) * j->sy + from * j->sx;
  const uint8_t *end = j->src + (j->top + j->yb - 1) * j->sy + (from + j->xb - j->xa) * j->sx;
  *size = (size_t)(end - first);
  return first;
}

void sf_lazy_write_field(const sf_field *f, void *dst) {
  if (f->recipe) f->recipe->write(f->recipe, dst);
  else if (sf_tensor_is_contiguous(&f->tensor)) memcpy(dst, sf_tensor_data(&f->tensor), sf_tensor_nbytes(&f->tensor));
  else sf_tensor_copy_to(&f->tensor, dst);
}
