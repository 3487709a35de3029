/* Antialiased uint8 resize, PIL's ImagingResample with the bilinear (triangle) filter: see resize.h. */
#include "resize.h"

#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SF_RESIZE_X86 1
#define SF_AVX2 __attribute__((target("avx2")))
#endif

/*
 * Two routes, the same bits: AVX2 kernels for 3 interleaved channels on x86-64 (below), and the
 * portable route (resize_strips) for everything else. The portable passes are written for gcc's
 * vectoriser (meson builds this file with -O3); on x86-64 they are also compiled for AVX2 (8 int32
 * lanes, and the vpmulld that SSE2 lacks), picked at load time. Not under ThreadSanitizer: the clones' ifunc resolvers run (instrumented) before its
 * runtime starts.
 */
#if defined(SF_RESIZE_X86) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define SF_RESIZE_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define SF_RESIZE_KERNEL
#endif

/* Pillow's PRECISION_BITS for 8-bit images: 32 - 8 - 2, so 255 * sum of weights fits an int32. */
enum { PRECISION_BITS = 22, HALF = 1 << (PRECISION_BITS - 1) };

/*
 * Taps of one axis: output i reads source pixels [start[i], start[i] + count[i]) with weights
 * k[i * ksize ..] (zero past count[i]; ksize is a multiple of 4 so the AVX2 pass reads taps in fours).
 */
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
  /* Locals, not cf's fields: the int32 stores below may alias its ksize, which would be re-read. */
  const int ksize = cf->ksize;
  const sf_resize_axis axis = *a;
  int32_t *start = cf->start, *count = cf->count, *k = cf->k;
  for (int64_t i = 0; i < axis.n; i++, k += ksize) {
    int64_t xmin, xmax;
    double center = window(&axis, axis.first + i, &xmin, &xmax);
    int n = (int)(xmax - xmin);
    double sum = 0.0;
    for (int x = 0; x < n; x++) sum += triangle(((double)(x + xmin) - center + 0.5) * ss);
    for (int x = 0; x < n; x++) {
      double w = triangle(((double)(x + xmin) - center + 0.5) * ss);
      double v = sum != 0.0 ? w / sum * (1 << PRECISION_BITS) : 0.0;
      k[x] = (int32_t)(v < 0 ? v - 0.5 : v + 0.5);
    }
    memset(k + n, 0, (size_t)(ksize - n) * sizeof(int32_t));
    start[i] = (int32_t)(axis.origin + xmin);
    count[i] = n;
  }
}

static inline uint8_t clip8(int32_t v) {
  v >>= PRECISION_BITS;
  return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

/* Outputs of an axis rounded up to 4: the AVX2 horizontal pass computes four at a time. */
static int64_t n4(const sf_resize_axis *a) { return (a->n + 3) & ~(int64_t)3; }

/* Coefficients of a filtered axis, in `mem`; ksize as Pillow sizes it (2 * ceil(scale) + 1), rounded up to 4. */
static size_t coeffs_bytes(const sf_resize_axis *a, int *ksize) {
  double scale = (double)a->span / (double)a->size;
  *ksize = ((int)ceil(scale < 1.0 ? 1.0 : scale) * 2 + 1 + 3) & ~3;
  return (size_t)n4(a) * (size_t)(*ksize + 2) * sizeof(int32_t);
}

/* The coefficients of outputs [0, n4) of a: those past n read the last output's first pixel with no taps. */
static coeffs coeffs_at(int32_t *mem, const sf_resize_axis *a, int ksize) {
  const int64_t n = n4(a);
  coeffs cf = {ksize, mem, mem + n, mem + 2 * n};
  compute(&cf, a);
  for (int64_t i = a->n; i < n; i++) {
    cf.start[i] = cf.start[a->n - 1], cf.count[i] = 0;
    memset(cf.k + i * ksize, 0, (size_t)ksize * sizeof(int32_t));
  }
  return cf;
}

/*
 * Vertical pass of bytes [from, len) of one output row: the rows[0..n) weighted by k, rounded and clamped
 * (Pillow's ImagingResampleVertical_8bpc). acc (len entries) keeps the loops over contiguous bytes,
 * which gcc vectorises.
 */
SF_RESIZE_KERNEL static void vpass(const uint8_t *const *rows, int n, const int32_t *k, int64_t from, int64_t len,
                                   int32_t *acc, uint8_t *out) {
  for (int64_t j = from; j < len; j++) acc[j] = HALF;
  for (int t = 0; t < n; t++) {
    const uint8_t *r = rows[t];
    const int32_t w = k[t];
    for (int64_t j = from; j < len; j++) acc[j] += r[j] * w;
  }
  for (int64_t j = from; j < len; j++) out[j] = clip8(acc[j]);
}

#ifdef SF_RESIZE_X86
/*
 * AVX2 kernels, exact: the same integer sums as the portable ones. The horizontal one multiplies
 * with vpmaddwd, which takes 16-bit weights: each 22-bit weight w is split as (w >> 15) * 2^15 +
 * (w & 0x7fff), two sums are kept and joined as (hi << 15) + lo, which is the sum of pixel * w.
 */
enum { SPLIT = 15 };

/*
 * The horizontal weights of cx as vpmaddwd operands: for each pair of output pixels (i, i + 1) and
 * each pair of taps (t, t + 1), two 256-bit vectors (the weights' hi, then lo parts) of 16-bit
 * weights laid out as hpass3_avx2's pixels are: lane 0 pixel i's [wt wt+1 wt wt+1 wt wt+1 0 0],
 * lane 1 pixel i + 1's (zero past n).
 */
static void madd_weights(const coeffs *cx, int64_t n, int16_t *wt) {
  const int steps = cx->ksize / 2;
  for (int64_t i = 0; i < n; i += 2)
    for (int st = 0; st < steps; st++, wt += 32)
      for (int half = 0; half < 2; half++)
        for (int lane = 0; lane < 2; lane++)
          for (int j = 0; j < 8; j++) {
            int32_t w = i + lane < n && j < 6 ? cx->k[(i + lane) * cx->ksize + 2 * st + (j & 1)] : 0;
            wt[half * 16 + lane * 8 + j] = (int16_t)(half ? w & ((1 << SPLIT) - 1) : w >> SPLIT);
          }
}

/*
 * Output pixels i (lane 0) and i + 1 (lane 1) of a row, from taps in pairs (steps of them) at byte
 * offsets a and b of row, weighted by w (madd_weights): lanes [R G B 0], rounded and shifted. Per
 * step: one 16-byte load per pixel, a shuffle into 16-bit (tap, tap + 1) pairs per channel, two
 * vpmaddwd (the weights' hi and lo parts).
 */
SF_AVX2 static inline __m256i pair3(const uint8_t *row, int64_t a, int64_t b, const __m256i *w, int steps) {
  const __m256i shuf = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, /* pixel i */
                                        0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1); /* pixel i + 1 */
  __m256i hi = _mm256_setzero_si256(), lo = hi;
  for (int st = 0; st < steps; st++, a += 6, b += 6, w += 2) {
    __m256i px = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(row + a))),
                                         _mm_loadu_si128((const __m128i *)(row + b)), 1);
    px = _mm256_shuffle_epi8(px, shuf);
    hi = _mm256_add_epi32(hi, _mm256_madd_epi16(px, _mm256_loadu_si256(w)));
    lo = _mm256_add_epi32(lo, _mm256_madd_epi16(px, _mm256_loadu_si256(w + 1)));
  }
  __m256i v = _mm256_add_epi32(_mm256_slli_epi32(hi, SPLIT), _mm256_add_epi32(lo, _mm256_set1_epi32(HALF)));
  return _mm256_srai_epi32(v, PRECISION_BITS);
}

/* How many taps hpass3_avx2 reads for outputs [i, i + 4) of cx: its steps of 2 taps. */
static int steps4(const coeffs *cx, int64_t i) {
  int c = cx->count[i];
  for (int q = 1; q < 4; q++) c = cx->count[i + q] > c ? cx->count[i + q] : c;
  return (c + 1) / 2;
}

/*
 * Horizontal pass of one RGB row (3 channels, pixels 3 bytes apart) for outputs [from, to) of cx
 * (multiples of 4) into out (output `from` first). Source pixel x is at row + 3 * x - base; each
 * output's taps are read in steps of 2 with 16-byte loads (rows need 16 readable bytes there).
 */
SF_AVX2 static void hpass3_avx2(const uint8_t *row, int64_t base, const coeffs *cx, const int16_t *wt, int64_t from,
                                int64_t to, uint8_t *out) {
  const __m128i pack = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
  const int steps = cx->ksize / 2;
  const int32_t *start = cx->start;
  row -= base;
  for (int64_t i = from; i < to; i += 4, out += 12) {
    const int st = steps4(cx, i);
    const __m256i *w = (const __m256i *)wt + i / 2 * steps * 2;
    __m256i v01, v23;
    if (st <= 2) { /* the common cases (up to 2x down): constant trip counts, unrolled */
      int k = st; /* 1 or 2 */
      v01 = pair3(row, start[i] * 3, start[i + 1] * 3, w, k == 1 ? 1 : 2);
      v23 = pair3(row, start[i + 2] * 3, start[i + 3] * 3, w + steps * 2, k == 1 ? 1 : 2);
    } else {
      v01 = pair3(row, start[i] * 3, start[i + 1] * 3, w, st);
      v23 = pair3(row, start[i + 2] * 3, start[i + 3] * 3, w + steps * 2, st);
    }
    __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(v01, v23), _mm256_setzero_si256());
    /* b's dwords: pixel i, i + 2 (lane 0), i + 1, i + 3 (lane 1), each R G B 0 */
    __m128i r = _mm_shuffle_epi8(_mm_unpacklo_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)), pack);
    _mm_storel_epi64((__m128i *)out, r);
    uint32_t last = (uint32_t)_mm_extract_epi32(r, 2);
    memcpy(out + 8, &last, 4);
  }
}

/*
 * The dense horizontal pass for RGB rows: output bytes in groups of 8 (output pixel j's channel ch
 * is byte 3 * j + ch of the row), so a register's int32 lanes are 8 consecutive output bytes and
 * the results store as they are. Each 128-bit half of a group covers at most 2 output pixels and
 * reads one 16-byte window of the row per step of 2 taps (the window slides 2 pixels a step); a
 * shuffle mask made per call puts each lane's (tap, tap + 1) bytes as 16-bit pairs for vpmaddwd.
 * It applies when the two pixels' first taps are at most 3 pixels apart (downscales up to about
 * 3x); the masks, weights and windows depend only on the x axis and are made once per call.
 */
typedef struct dense {
  int steps;      /* of 2 taps, the most any output needs */
  int64_t groups; /* of 8 output bytes, a multiple of 4 */
  int32_t *ofs;   /* per group, the byte offsets (3 * source column) of its two halves' first windows */
  __m256i *tab;   /* per group, per step: shuffle mask, weights' hi parts, weights' lo parts */
} dense;

/* Fills d (arrays sized by the caller for d->groups, d->steps) for outputs [0, n) of cx; false if it does not apply. */
static bool dense_make(dense *d, const coeffs *cx, int64_t n) {
  /* Locals, not cx's and d's fields: the byte stores below may alias anything, so fields would be re-read. */
  const int32_t *start = cx->start, *count = cx->count, *k = cx->k;
  const int ksize = cx->ksize, steps = d->steps;
  const int64_t groups = d->groups;
  uint8_t *tab = (uint8_t *)d->tab;
  int32_t *ofs = d->ofs;
  memset(tab, 0, (size_t)groups * (size_t)steps * 3 * sizeof(__m256i));
  for (int64_t g = 0; g < groups; g++)
    for (int half = 0; half < 2; half++) {
      const int64_t s0 = 8 * g + 4 * half, j0 = s0 / 3 < n ? s0 / 3 : n - 1;
      ofs[2 * g + half] = start[j0] * 3;
      for (int q = 0; q < 4; q++) {
        const int64_t j = (s0 + q) / 3, ch = (s0 + q) % 3;
        if (j >= n) break;
        const int dist = start[j] - start[j0], taps = count[j];
        if (3 * dist + 5 >= 16) return false;
        const int32_t *w = k + j * ksize;
        for (int t = 0; t < taps; t++) {
          /* step t / 2's three vectors: the mask, the weights' hi parts, their lo parts */
          uint8_t *e = tab + (size_t)((g * steps + t / 2) * 3) * sizeof(__m256i);
          const int at = half * 16 + 4 * q + 2 * (t & 1); /* byte of the mask, of the 16-bit pair */
          /* lanes without taps keep mask 0 and weight 0: they read byte 0 and add nothing */
          e[at] = (uint8_t)(3 * dist + ch + 3 * (t & 1)), e[at + 1] = 0x80;
          int16_t hi = (int16_t)(w[t] >> SPLIT), lo = (int16_t)(w[t] & ((1 << SPLIT) - 1));
          memcpy(e + sizeof(__m256i) + at, &hi, 2);
          memcpy(e + 2 * sizeof(__m256i) + at, &lo, 2);
        }
      }
    }
  return true;
}

/* One group of dense_make's: its 8 output bytes as int32 lanes. steps is d->steps (a constant when inlined). */
SF_AVX2 static inline __m256i dense_group(const uint8_t *p0, const uint8_t *p1, const __m256i *e, int steps) {
  __m256i hi = _mm256_setzero_si256(), lo = hi;
  for (int st = 0; st < steps; st++, p0 += 6, p1 += 6, e += 3) {
    __m256i px = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                         _mm_loadu_si128((const __m128i *)p1), 1);
    px = _mm256_shuffle_epi8(px, _mm256_load_si256(e));
    hi = _mm256_add_epi32(hi, _mm256_madd_epi16(px, _mm256_load_si256(e + 1)));
    lo = _mm256_add_epi32(lo, _mm256_madd_epi16(px, _mm256_load_si256(e + 2)));
  }
  __m256i v = _mm256_add_epi32(_mm256_slli_epi32(hi, SPLIT), _mm256_add_epi32(lo, _mm256_set1_epi32(HALF)));
  return _mm256_srai_epi32(v, PRECISION_BITS);
}

/* dense_avx2's loop; steps is d->steps (a constant when inlined). */
SF_AVX2 static inline void dense_loop(const uint8_t *row, const dense *d, int64_t from, int64_t to, uint8_t *out,
                                      int steps) {
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const int32_t *o = d->ofs + 2 * from;
  const __m256i *e = d->tab + from * steps * 3;
  for (int64_t g = from; g < to; g += 4, out += 32, o += 8, e += 12 * steps) {
    __m256i a0 = dense_group(row + o[0], row + o[1], e, steps);
    __m256i a1 = dense_group(row + o[2], row + o[3], e + 3 * steps, steps);
    __m256i a2 = dense_group(row + o[4], row + o[5], e + 6 * steps, steps);
    __m256i a3 = dense_group(row + o[6], row + o[7], e + 9 * steps, steps);
    __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
    _mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(b, order));
  }
}

/*
 * Groups [from, to) (multiples of 4) of d for one RGB row, into out (group `from` first, 32 bytes
 * a 4 groups). Source pixel x is at row + 3 * x - base; each group reads 16 + 6 * (steps - 1)
 * bytes from each of its two offsets.
 */
SF_AVX2 static void dense_avx2(const uint8_t *row, int64_t base, const dense *d, int64_t from, int64_t to,
                               uint8_t *out) {
  row -= base;
  if (d->steps == 1) /* the common cases (up to 2x down, up): unrolled */
    dense_loop(row, d, from, to, out, 1);
  else if (d->steps == 2)
    dense_loop(row, d, from, to, out, 2);
  else
    dense_loop(row, d, from, to, out, d->steps);
}

/* vpass with AVX2: 32 bytes per step, their four accumulators in registers across the taps. */
SF_AVX2 static void vpass_avx2(const uint8_t *const *rows, int n, const int32_t *k, int64_t len, int32_t *acc,
                               uint8_t *out) {
  const __m256i half = _mm256_set1_epi32(HALF), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t j = 0;
  for (; j + 32 <= len; j += 32) {
    __m256i a[4] = {half, half, half, half};
    for (int t = 0; t < n; t++) {
      const uint8_t *r = rows[t] + j;
      const __m256i w = _mm256_set1_epi32(k[t]);
      for (int q = 0; q < 4; q++)
        a[q] = _mm256_add_epi32(
            a[q], _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(r + 8 * q))), w));
    }
    for (int q = 0; q < 4; q++) a[q] = _mm256_srai_epi32(a[q], PRECISION_BITS);
    /* packs/packus work per 128-bit lane: dwords come out as a0 a1 a2 a3 (low halves), then the high ones */
    __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(a[0], a[1]), _mm256_packs_epi32(a[2], a[3]));
    _mm256_storeu_si256((__m256i *)(out + j), _mm256_permutevar8x32_epi32(b, order));
  }
  vpass(rows, n, k, j, len, acc, out);
}

/* Whether the AVX2 kernels run: the CPU has AVX2 and SF_RESIZE_PORTABLE is unset or empty. */
static bool use_avx2(void) {
  static atomic_int mode; /* 0 unknown, 1 portable, 2 avx2 */
  int m = atomic_load_explicit(&mode, memory_order_relaxed);
  if (!m) {
    const char *e = getenv("SF_RESIZE_PORTABLE");
    __builtin_cpu_init();
    m = (e && *e) || !__builtin_cpu_supports("avx2") ? 1 : 2;
    atomic_store_explicit(&mode, m, memory_order_relaxed);
  }
  return m == 2;
}
#else
static bool use_avx2(void) { return false; }
#endif

/*
 * Copies the rows x cols pixel block at src (byte strides sy/sx/sc, c channels) transposed into out:
 * out[(x * rows + y) * c + ch] = src[y][x][ch]. Rows of the result are columns of the source, so the
 * horizontal pass becomes a pass over contiguous rows, as the vertical one is.
 */
SF_RESIZE_KERNEL static void transpose(const uint8_t *src, ptrdiff_t sy, ptrdiff_t sx, ptrdiff_t sc, int c,
                                       int64_t rows, int64_t cols, uint8_t *out) {
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

/* Outputs [0, n) of cf over rows of len bytes, the first of them source row `base`: vpass per output. */
static void filter_rows(const uint8_t *in, int64_t base, int64_t len, const coeffs *cf, int64_t n,
                        const uint8_t **taps, int32_t *acc, uint8_t *out) {
  for (int64_t i = 0; i < n; i++, out += len) {
    for (int t = 0; t < cf->count[i]; t++) taps[t] = in + (cf->start[i] - base + t) * len;
    vpass(taps, cf->count[i], cf->k + i * cf->ksize, 0, len, acc, out);
  }
}

/*
 * The portable route (no AVX2, or not 3 interleaved channels): the horizontal pass runs on transposed
 * strips of source rows, so that both passes are loops over contiguous bytes, which the compiler
 * vectorises for any target (SSE2, NEON); a scalar per-pixel horizontal pass is 2-5x slower.
 */
static int resize_strips(const uint8_t *src, ptrdiff_t sy, ptrdiff_t sx, ptrdiff_t sc, int c,
                         const sf_resize_axis *ay, const sf_resize_axis *ax, uint8_t *dst) {
  int ky = 0, kx = 0;
  bool fy = ay->span != ay->size, fx = ax->span != ax->size;
  size_t by = fy ? coeffs_bytes(ay, &ky) : 0, bx = fx ? coeffs_bytes(ax, &kx) : 0;
  int64_t y0, y1, x0, x1;
  sf_resize_reads(ay, &y0, &y1);
  sf_resize_reads(ax, &x0, &x1);
  /*
   * Scratch: coefficients; tap pointers; accumulators; one strip of STRIP source rows transposed, and
   * its horizontal pass (both small enough for the cache); then the rows the vertical pass reads (the
   * output itself when y is not filtered).
   */
  enum { STRIP = 32 };
  const int64_t rows = y1 - y0, cols = x1 - x0, row_len = ax->n * c, strip_len = STRIP * c;
  size_t n_taps = (size_t)(ky > kx ? ky : kx) + 1, n_acc = (size_t)(row_len > strip_len ? row_len : strip_len);
  size_t n_t = fx ? (size_t)((cols + ax->n) * strip_len) : 0, n_tmp = fy ? (size_t)(rows * row_len) : 0;
  uint8_t *mem = malloc(by + bx + n_taps * sizeof(uint8_t *) + n_acc * sizeof(int32_t) + n_t + n_tmp);
  if (!mem) return SF_ENOMEM;
  coeffs cy = {0}, cx = {0};
  if (fy) cy = coeffs_at((int32_t *)mem, ay, ky);
  if (fx) cx = coeffs_at((int32_t *)(mem + by), ax, kx);
  const uint8_t **taps = (const uint8_t **)(mem + by + bx);
  int32_t *acc = (int32_t *)(taps + n_taps);
  uint8_t *t = (uint8_t *)(acc + n_acc), *h = t + cols * strip_len, *tmp = fy ? t + n_t : dst;
  const uint8_t *block = src + y0 * sy + x0 * sx;
  for (int64_t s0 = 0; s0 < rows; s0 += STRIP) {
    const int64_t n = rows - s0 < STRIP ? rows - s0 : STRIP;
    if (fx) { /* horizontal: transpose the strip, filter its rows (= source columns), transpose back */
      transpose(block + s0 * sy, sy, sx, sc, c, n, cols, t);
      filter_rows(t, x0, n * c, &cx, ax->n, taps, acc, h);
      transpose(h, n * c, c, 1, c, ax->n, n, tmp + s0 * row_len);
    } else { /* a transpose of the transposed: the plain window */
      transpose(block + s0 * sy, sx, sy, sc, c, cols, n, tmp + s0 * row_len);
    }
  }
  if (fy) filter_rows(tmp, y0, row_len, &cy, ay->n, taps, acc, dst);
  free(mem);
  return 0;
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

/* What one call needs to make a horizontally resampled source row. */
typedef struct hctx {
  const uint8_t *src;
  ptrdiff_t sy, sx, sc;
  int c;
  bool fx, avx2;
  const coeffs *cx;
  const int16_t *wt; /* madd_weights of cx (avx2) */
  int64_t x0, x1, n; /* source columns read, outputs */
#ifdef SF_RESIZE_X86
  const dense *d;    /* dense_avx2's tables, or NULL: hpass3_avx2 (avx2) */
#endif
  /* avx2: outputs [0, safe) (groups with d) read inside the row; the rest read from a copy of its
     bytes [tail, x1 * 3) in tbuf (3 * ksize + 32 bytes longer), into tout (12 bytes a 4 outputs; not with d) */
  int64_t safe, tail;
  uint8_t *tbuf, *tout;
} hctx;

/* Source row y resampled along x: written to out (n * c bytes rounded up to 32 writable), or the source row itself. */
static const uint8_t *hrow(const hctx *h, int64_t y, uint8_t *out) {
  const uint8_t *row = h->src + y * h->sy;
  if (!h->fx) {
    if (h->sx == h->c && h->sc == 1) return row + h->x0 * h->sx;
    for (int64_t i = 0; i < h->n; i++)
      for (int ch = 0; ch < h->c; ch++) out[i * h->c + ch] = row[(h->x0 + i) * h->sx + ch * h->sc];
    return out;
  }
#ifdef SF_RESIZE_X86
  if (h->d) {
    dense_avx2(row, 0, h->d, 0, h->safe, out);
    if (h->safe < h->d->groups) {
      memcpy(h->tbuf, row + h->tail, (size_t)(h->x1 * 3 - h->tail));
      dense_avx2(h->tbuf, h->tail, h->d, h->safe, h->d->groups, out + h->safe * 8);
    }
    return out;
  }
  if (h->avx2) {
    hpass3_avx2(row, 0, h->cx, h->wt, 0, h->safe, out);
    if (h->safe < h->n) {
      memcpy(h->tbuf, row + h->tail, (size_t)(h->x1 * 3 - h->tail));
      hpass3_avx2(h->tbuf, h->tail, h->cx, h->wt, h->safe, (h->n + 3) & ~(int64_t)3, h->tout);
      memcpy(out + h->safe * 3, h->tout, (size_t)(h->n - h->safe) * 3);
    }
    return out;
  }
#endif
  return out; /* not reached: sf_resize_u8_simd routes what AVX2 does not take to resize_strips */
}

#ifdef SF_RESIZE_X86
/*
 * The AVX2 horizontal pass's tables for h (cx's outputs, kx taps): dense_avx2's in *d when it applies
 * (d->tab allocated here, the caller frees it), else hpass3_avx2's madd weights in h->wt; then which
 * outputs read inside the row and where the rest read a copy of its tail (tbuf: bw bytes after wt).
 * Returns 0 or SF_ENOMEM.
 */
static int hpass_prepare(hctx *h, dense *d, const coeffs *cx, const sf_resize_axis *ax, int kx, size_t bw) {
  const int64_t row_len = ax->n * h->c, x1 = h->x1;
  int16_t *wt = (int16_t *)h->wt;
  int most = 0;
  for (int64_t i = 0; i < ax->n; i++) most = cx->count[i] > most ? cx->count[i] : most;
  d->steps = (most + 1) / 2, d->groups = (row_len + 31) / 32 * 4;
  d->tab = aligned_alloc(32, (size_t)d->groups * ((size_t)d->steps * 3 * sizeof(__m256i) + 2 * sizeof(int32_t)));
  if (!d->tab) return SF_ENOMEM;
  d->ofs = (int32_t *)(d->tab + d->groups * d->steps * 3);
  h->tbuf = (uint8_t *)wt + bw;
  if (dense_make(d, cx, ax->n)) {
    h->d = d;
    for (const int64_t end = x1 * 3; h->safe < d->groups; h->safe += 4) {
      int32_t last = d->ofs[2 * (h->safe + 3) + 1]; /* offsets grow along the row */
      if (last + 6 * (d->steps - 1) + 16 > end) break;
    }
    h->tail = h->safe < d->groups ? d->ofs[2 * h->safe] : 0;
    return 0;
  }
  madd_weights(cx, n4(ax), wt);
  /* outputs in fours while their 16-byte loads end inside the row and the four are outputs */
  while (h->safe + 4 <= ax->n && cx->start[h->safe + 3] * 3 + 6 * (steps4(cx, h->safe) - 1) + 16 <= x1 * 3)
    h->safe += 4;
  h->tail = cx->start[h->safe < ax->n ? h->safe : 0] * 3;
  h->tout = h->tbuf + (x1 * 3 - h->tail) + kx * 3 + 32;
  return 0;
}
#endif

/* The ring of horizontally resampled rows the vertical pass reads (see sf_resize_u8_simd's scratch). */
typedef struct row_ring {
  int size;
  int64_t stride;
  uint8_t *bytes;
  const uint8_t **rows, **taps;
  int32_t *acc;
} row_ring;

/*
 * dst's rows: each output row of ay from the window of source rows it reads, each of them resampled
 * along x once (h) into the ring r; without resampling along y, the rows resampled along x themselves.
 */
static void resample_rows(const hctx *h, const coeffs *cy, const sf_resize_axis *ay, int64_t y0, bool fy, bool avx2,
                          const row_ring *r, uint8_t *dst) {
  const int64_t row_len = h->n * h->c;
  if (!fy) {
    for (int64_t i = 0; i < ay->n; i++) memcpy(dst + i * row_len, hrow(h, y0 + i, r->bytes), (size_t)row_len);
    return;
  }
  int64_t next = y0; /* the next source row to resample */
  for (int64_t i = 0; i < ay->n; i++) {
    const int64_t s = cy->start[i], e = s + cy->count[i];
    if (next < s) next = s;
    for (; next < e; next++) {
      int64_t slot = (next - y0) % r->size;
      r->rows[slot] = hrow(h, next, r->bytes + slot * r->stride);
    }
    for (int t = 0, slot = (int)((s - y0) % r->size); t < cy->count[i]; t++, slot = slot + 1 < r->size ? slot + 1 : 0)
      r->taps[t] = r->rows[slot];
#ifdef SF_RESIZE_X86
    if (avx2) {
      vpass_avx2(r->taps, cy->count[i], cy->k + i * cy->ksize, row_len, r->acc, dst + i * row_len);
      continue;
    }
#endif
    vpass(r->taps, cy->count[i], cy->k + i * cy->ksize, 0, row_len, r->acc, dst + i * row_len);
  }
  (void)avx2;
}

int sf_resize_u8_simd(const uint8_t *src, ptrdiff_t sy, ptrdiff_t sx, ptrdiff_t sc, int c, const sf_resize_axis *ay,
                      const sf_resize_axis *ax, uint8_t *dst, bool simd) {
  int ky = 0, kx = 0;
  bool fy = ay->span != ay->size, fx = ax->span != ax->size;
  bool avx2 = simd && use_avx2();
  if (!(avx2 && c == 3 && sx == 3 && sc == 1)) return resize_strips(src, sy, sx, sc, c, ay, ax, dst);
  bool h3 = fx; /* hpass3_avx2 (or dense_avx2) applies */
  size_t by = fy ? coeffs_bytes(ay, &ky) : 0, bx = fx ? coeffs_bytes(ax, &kx) : 0;
  size_t bw = h3 ? (size_t)n4(ax) * (size_t)kx * 8 * sizeof(int16_t) : 0;
  int64_t y0, y1, x0, x1;
  sf_resize_reads(ay, &y0, &y1);
  sf_resize_reads(ax, &x0, &x1);
  /*
   * Scratch: the coefficients, the madd weights, the row tail hpass3_avx2 reads from a copy; a ring
   * of the horizontally resampled rows the vertical pass reads (as many as its widest window), their
   * pointers in ring order and in the order of one output's taps, and the accumulators of the
   * portable vertical pass. The byte arrays before the pointers are multiples of 32 bytes long.
   */
  const int64_t row_len = ax->n * c;
  row_ring ring = {.size = 1, .stride = (row_len + 32) & ~(int64_t)31};
  if (fy) {
    double scale = (double)ay->span / (double)ay->size;
    ring.size = (int)ceil(scale < 1.0 ? 1.0 : scale) * 2 + 1;
  }
  size_t n_ring = (size_t)(ring.size * ring.stride);
  size_t n_tail = h3 ? (size_t)(x1 - ax->origin) * 3 + (size_t)kx * 3 + 32 + (size_t)n4(ax) * 3 + 16 : 0;
  n_tail = (n_tail + 31) & ~(size_t)31;
  uint8_t *mem = malloc(by + bx + bw + 32 + n_tail + n_ring + 2 * (size_t)ring.size * sizeof(uint8_t *) +
                        (size_t)row_len * sizeof(int32_t));
  if (!mem) return SF_ENOMEM;
  coeffs cy = {0}, cx = {0};
  if (fy) cy = coeffs_at((int32_t *)mem, ay, ky);
  if (fx) cx = coeffs_at((int32_t *)(mem + by), ax, kx);
  int16_t *wt = (int16_t *)(((uintptr_t)(mem + by + bx) + 31) & ~(uintptr_t)31);
  ring.bytes = (uint8_t *)wt + bw + n_tail;
  ring.rows = (const uint8_t **)(ring.bytes + n_ring);
  ring.taps = ring.rows + ring.size;
  ring.acc = (int32_t *)(ring.taps + ring.size);
  if (h3) memset((uint8_t *)wt + bw, 0, n_tail); /* the tail copy's bytes past the row: read, weighted 0 */
  hctx h = {.src = src, .sy = sy, .sx = sx, .sc = sc, .c = c, .fx = fx, .avx2 = h3, .cx = &cx, .wt = wt};
  h.x0 = x0, h.x1 = x1, h.n = ax->n;
#ifdef SF_RESIZE_X86
  dense d = {0};
  if (h3 && hpass_prepare(&h, &d, &cx, ax, kx, bw) < 0) {
    free(mem);
    return SF_ENOMEM;
  }
#endif
  resample_rows(&h, &cy, ay, y0, fy, avx2, &ring, dst);
#ifdef SF_RESIZE_X86
  free(d.tab);
#endif
  free(mem);
  return 0;
}

int sf_resize_u8(const uint8_t *src, ptrdiff_t sy, ptrdiff_t sx, ptrdiff_t sc, int c, const sf_resize_axis *ay,
                 const sf_resize_axis *ax, uint8_t *dst) {
  return sf_resize_u8_simd(src, sy, sx, sc, c, ay, ax, dst, true);
}
