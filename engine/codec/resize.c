/* Antialiased uint8 resize, PIL's ImagingResample with the bilinear (triangle) filter: see resize.h. */
#include "resize.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/error.h"

/*
 * The row loops are written for gcc's vectoriser (meson builds this file with -O3); on x86-64 they
 * are also compiled for AVX2 (8 int32 lanes, and the vpmulld that SSE2 lacks), picked at load time.
 */
/* Not under ThreadSanitizer: the clones' ifunc resolvers run (instrumented) before its runtime starts. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define SF_RESIZE_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define SF_RESIZE_KERNEL
#endif

/* Pillow's PRECISION_BITS for 8-bit images: 32 - 8 - 2, so 255 * sum of weights fits an int32. */
enum { PRECISION_BITS = 22 };

/* Taps of one axis: output i reads source pixels [start[i], start[i] + count[i]) with weights k[i * ksize ..]. */
typedef struct coeffs {
  int ksize;
  int32_t *start, *count, *k;
} coeffs;

static double triangle(double x) {
  x = fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

/* Pillow's filter window of output k of a filtered axis: its centre and source pixels [*xmin, *xmax) of the span. */
static double window(const sf_resize_axis *a, int64_t k, int64_t *xmin, int64_t *xmax) {
  double scale = (double)a->span / (double)a->size, filterscale = scale < 1.0 ? 1.0 : scale;
  double support = 1.0 * filterscale, center = ((double)k + 0.5) * scale;
  *xmin = (int64_t)(center - support + 0.5), *xmax = (int64_t)(center + support + 0.5);
  if (*xmin < 0) *xmin = 0;
  if (*xmax > a->span) *xmax = a->span;
  return center;
}

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for outputs [first, first+n) of one axis. */
static void compute(coeffs *cf, const sf_resize_axis *a) {
  double scale = (double)a->span / (double)a->size, filterscale = scale < 1.0 ? 1.0 : scale;
  double ss = 1.0 / filterscale;
  for (int64_t i = 0; i < a->n; i++) {
    int64_t xmin, xmax;
    double center = window(a, a->first + i, &xmin, &xmax);
    int n = (int)(xmax - xmin);
    double sum = 0.0;
    for (int x = 0; x < n; x++) sum += triangle(((double)(x + xmin) - center + 0.5) * ss);
    int32_t *k = cf->k + i * cf->ksize;
    for (int x = 0; x < cf->ksize; x++) {
      double w = x < n ? triangle(((double)(x + xmin) - center + 0.5) * ss) : 0.0;
      double v = sum != 0.0 ? w / sum * (1 << PRECISION_BITS) : 0.0;
      k[x] = (int32_t)(v < 0 ? v - 0.5 : v + 0.5);
    }
    cf->start[i] = (int32_t)(a->origin + xmin);
    cf->count[i] = n;
  }
}

static inline uint8_t clip8(int32_t v) {
  v >>= PRECISION_BITS;
  return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/*
 * Copies the rows x cols pixel block at src (byte strides sy/sx/sc, c channels) transposed into out:
 * out[(x * rows + y) * c + ch] = src[y][x][ch]. Rows of the result are columns of the source, so the
 * horizontal pass becomes a pass over contiguous rows, as the vertical one is.
 */
SF_RESIZE_KERNEL static void transpose(const uint8_t *src, ptrdiff_t sy, ptrdiff_t sx, ptrdiff_t sc, int c, int64_t rows,
                      int64_t cols, uint8_t *out) {
  for (int64_t y0 = 0; y0 < rows; y0 += 16) { /* 16-row strips keep the written lines in cache */
    int64_t y1 = y0 + 16 < rows ? y0 + 16 : rows;
    for (int64_t x = 0; x < cols; x++) {
      uint8_t *o = out + (x * rows + y0) * c;
      const uint8_t *p = src + y0 * sy + x * sx;
      if (c == 3 && sc == 1 && sx >= 3 && x + 1 < cols) {
        /* RGB: 4-byte moves. The 4th byte read is the next pixel's, in the same row; the one written
           is pixel y + 1's of this column, written after (the last row goes byte by byte). */
        int64_t y = y0;
        for (; y < y1 && y + 1 < rows; y++, o += 3, p += sy) memcpy(o, p, 4);
        for (; y < y1; y++, o += 3, p += sy) o[0] = p[0], o[1] = p[1], o[2] = p[2];
      } else {
        for (int64_t y = y0; y < y1; y++, o += c, p += sy)
          for (int ch = 0; ch < c; ch++) o[ch] = p[ch * sc];
      }
    }
  }
}

/*
 * One filtered axis over rows of len bytes: output row i is the weighted sum of input rows
 * start[i] - base .. + count[i], rounded and clamped. The inner loops run over contiguous bytes with
 * int32 accumulators (acc, len entries), which gcc vectorises.
 */
SF_RESIZE_KERNEL static void pass(const uint8_t *in, int64_t base, int64_t len, const coeffs *cf, int64_t n, int32_t *acc,
                 uint8_t *out) {
  for (int64_t i = 0; i < n; i++, out += len) {
    const int32_t *k = cf->k + i * cf->ksize;
    const uint8_t *rows = in + (cf->start[i] - base) * len;
    for (int64_t j = 0; j < len; j++) acc[j] = 1 << (PRECISION_BITS - 1);
    for (int t = 0; t < cf->count[i]; t++) {
      const uint8_t *r = rows + t * len;
      const int32_t w = k[t];
      for (int64_t j = 0; j < len; j++) acc[j] += r[j] * w;
    }
    for (int64_t j = 0; j < len; j++) out[j] = clip8(acc[j]);
  }
}

/* Coefficients of a filtered axis, in `mem`; ksize as Pillow sizes it. */
static size_t coeffs_bytes(const sf_resize_axis *a, int *ksize) {
  double scale = (double)a->span / (double)a->size;
  *ksize = (int)ceil(scale < 1.0 ? 1.0 : scale) * 2 + 1;
  return (size_t)a->n * (size_t)(*ksize + 2) * sizeof(int32_t);
}

static coeffs coeffs_at(int32_t *mem, const sf_resize_axis *a, int ksize) {
  coeffs cf = {ksize, mem, mem + a->n, mem + 2 * a->n};
  compute(&cf, a);
  return cf;
}

void sf_resize_reads(const sf_resize_axis *a, int64_t *lo, int64_t *hi) {
  if (a->span == a->size) {
    *lo = a->origin + a->first, *hi = *lo + a->n;
    return;
  }
  int64_t unused;
  window(a, a->first, lo, &unused);
  window(a, a->first + a->n - 1, &unused, hi);
  *lo += a->origin, *hi += a->origin;
}

int sf_resize_u8(const uint8_t *src, ptrdiff_t sy, ptrdiff_t sx, ptrdiff_t sc, int c, const sf_resize_axis *ay,
                 const sf_resize_axis *ax, uint8_t *dst) {
  int ky = 0, kx = 0;
  bool fy = ay->span != ay->size, fx = ax->span != ax->size;
  size_t by = fy ? coeffs_bytes(ay, &ky) : 0, bx = fx ? coeffs_bytes(ax, &kx) : 0;
  int32_t *mem = malloc(by + bx + 1);
  if (!mem) return SF_ENOMEM;
  coeffs cy = {0}, cx = {0};
  if (fy) cy = coeffs_at(mem, ay, ky);
  if (fx) cx = coeffs_at(mem + by / sizeof(int32_t), ax, kx);
  int64_t y0, y1, x0, x1;
  sf_resize_reads(ay, &y0, &y1);
  sf_resize_reads(ax, &x0, &x1);
  /*
   * Scratch: accumulators; one strip of STRIP source rows transposed, and its horizontal pass (both
   * small enough for the cache); then the rows the vertical pass reads (the output itself when y is
   * not filtered).
   */
  enum { STRIP = 32 };
  const int64_t rows = y1 - y0, cols = x1 - x0, row_len = ax->n * c, strip_len = STRIP * c;
  size_t n_acc = (size_t)(row_len > strip_len ? row_len : strip_len);
  size_t n_t = fx ? (size_t)((cols + ax->n) * strip_len) : 0, n_tmp = fy ? (size_t)(rows * row_len) : 0;
  int32_t *acc = malloc(n_acc * sizeof(int32_t) + n_t + n_tmp);
  if (!acc) {
    free(mem);
    return SF_ENOMEM;
  }
  uint8_t *t = (uint8_t *)(acc + n_acc), *h = t + cols * strip_len, *tmp = fy ? t + n_t : dst;
  const uint8_t *block = src + y0 * sy + x0 * sx;
  for (int64_t s0 = 0; s0 < rows; s0 += STRIP) {
    const int64_t n = rows - s0 < STRIP ? rows - s0 : STRIP;
    if (fx) { /* horizontal: transpose the strip, filter its rows (= source columns), transpose back */
      transpose(block + s0 * sy, sy, sx, sc, c, n, cols, t);
      pass(t, x0, n * c, &cx, ax->n, acc, h);
      transpose(h, n * c, c, 1, c, ax->n, n, tmp + s0 * row_len);
    } else { /* a transpose of the transposed: the plain window */
      transpose(block + s0 * sy, sx, sy, sc, c, cols, n, tmp + s0 * row_len);
    }
  }
  if (fy) pass(tmp, y0, row_len, &cy, ay->n, acc, dst);
  free(acc);
  free(mem);
  return 0;
}
