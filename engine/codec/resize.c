/* Antialiased uint8 resize, PIL's ImagingResample with the bilinear (triangle) filter: see resize.h. */
#include "resize.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/error.h"

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

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc for outputs [first, first+n) of one axis. */
static void compute(coeffs *cf, const sf_resize_axis *a) {
  double scale = (double)a->span / (double)a->size, filterscale = scale < 1.0 ? 1.0 : scale;
  double support = 1.0 * filterscale, ss = 1.0 / filterscale;
  for (int64_t i = 0; i < a->n; i++) {
    double center = ((double)(a->first + i) + 0.5) * scale;
    int64_t xmin = (int64_t)(center - support + 0.5), xmax = (int64_t)(center + support + 0.5);
    if (xmin < 0) xmin = 0;
    if (xmax > a->span) xmax = a->span;
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

/* Horizontal pass over one row: ox outputs of c channels, contiguous, from a row with strides sx/sc. */
static void horizontal(const uint8_t *row, ptrdiff_t sx, ptrdiff_t sc, int c, const coeffs *cf, int64_t n,
                       uint8_t *out) {
  for (int64_t x = 0; x < n; x++, out += c) {
    const int32_t *k = cf->k + x * cf->ksize;
    const uint8_t *p = row + cf->start[x] * sx;
    const int m = cf->count[x];
    if (c == 3 && sc == 1) { /* the common RGB case: three accumulators, one pass over the taps */
      int32_t a0 = 1 << (PRECISION_BITS - 1), a1 = a0, a2 = a0;
      for (int t = 0; t < m; t++, p += sx) a0 += p[0] * k[t], a1 += p[1] * k[t], a2 += p[2] * k[t];
      out[0] = clip8(a0), out[1] = clip8(a1), out[2] = clip8(a2);
      continue;
    }
    for (int ch = 0; ch < c; ch++) {
      int32_t acc = 1 << (PRECISION_BITS - 1);
      for (int t = 0; t < m; t++) acc += p[t * sx + ch * sc] * k[t];
      out[ch] = clip8(acc);
    }
  }
}

/* Vertical pass of one output row: len contiguous bytes from rows `rows` (row stride rs). Vectorises. */
static void vertical(const uint8_t *rows, ptrdiff_t rs, const int32_t *k, int m, int32_t *acc, int64_t len,
                     uint8_t *out) {
  for (int64_t i = 0; i < len; i++) acc[i] = 1 << (PRECISION_BITS - 1);
  for (int t = 0; t < m; t++) {
    const uint8_t *r = rows + t * rs;
    const int32_t w = k[t];
    for (int64_t i = 0; i < len; i++) acc[i] += r[i] * w;
  }
  for (int64_t i = 0; i < len; i++) out[i] = clip8(acc[i]);
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

int sf_resize_u8(const uint8_t *src, ptrdiff_t sy, ptrdiff_t sx, ptrdiff_t sc, int c, const sf_resize_axis *ay,
                 const sf_resize_axis *ax, uint8_t *dst) {
  const int64_t row_len = ax->n * c;
  int ky = 0, kx = 0;
  bool fy = ay->span != ay->size, fx = ax->span != ax->size;
  size_t by = fy ? coeffs_bytes(ay, &ky) : 0, bx = fx ? coeffs_bytes(ax, &kx) : 0;
  /* Source rows the vertical pass reads; the horizontal pass runs on these only. */
  int64_t y0 = ay->origin + ay->first, y1 = y0 + ay->n;
  int32_t *mem = malloc(by + bx + 1);
  if (!mem) return SF_ENOMEM;
  coeffs cy = {0}, cx = {0};
  if (fy) {
    cy = coeffs_at(mem, ay, ky);
    y0 = cy.start[0];
    y1 = cy.start[ay->n - 1] + cy.count[ay->n - 1];
  }
  if (fx) cx = coeffs_at(mem + by / sizeof(int32_t), ax, kx);
  /* Horizontal pass (or a copy of the window) into rows of row_len bytes; the vertical pass reads them. */
  int32_t *acc = fy ? malloc((size_t)row_len * sizeof(int32_t) + (size_t)(y1 - y0) * (size_t)row_len) : NULL;
  uint8_t *tmp = fy ? (uint8_t *)(acc + row_len) : dst;
  if (fy && !acc) {
    free(mem);
    return SF_ENOMEM;
  }
  const uint8_t *left = src + (ax->origin + ax->first) * sx;
  for (int64_t y = y0; y < y1; y++) {
    uint8_t *o = tmp + (y - y0) * row_len;
    if (fx) {
      horizontal(src + y * sy, sx, sc, c, &cx, ax->n, o);
    } else if (sx == c && sc == 1) {
      memcpy(o, left + y * sy, (size_t)row_len);
    } else {
      for (int64_t x = 0; x < ax->n; x++)
        for (int ch = 0; ch < c; ch++) o[x * c + ch] = left[y * sy + x * sx + ch * sc];
    }
  }
  if (fy) {
    for (int64_t y = 0; y < ay->n; y++)
      vertical(tmp + (cy.start[y] - y0) * row_len, row_len, cy.k + y * ky, cy.count[y], acc, row_len,
               dst + y * row_len);
    free(acc);
  }
  free(mem);
  return 0;
}
