/* augment's RGB -> float32 CHW pass, with an AVX2+FMA path picked at run time (see normalize.h). */
#include "normalize.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SF_NORMALIZE_AVX2 1
#endif

bool sf_normalize_matches(const float *table, double scale, double shift) {
  for (int x = 0; x < 256; x++)
    if ((float)fma((double)x, scale, shift) != table[x]) return false;
  return true;
}

void sf_normalize_rgb_f32_scalar(const uint8_t *q, ptrdiff_t step, int64_t n, const sf_normalize *nm,
                                 float *const out[3]) {
  for (int c = 0; c < 3; c++) {
    const double a = nm->scale[c], b = nm->shift[c];
    float *o = out[c];
    const uint8_t *p = q + c;
    for (int64_t i = 0; i < n; i++, p += step) o[i] = (float)fma((double)*p, a, b);
  }
}

#ifdef SF_NORMALIZE_AVX2
/*
 * pshufb masks taking channel c of eight pixels out of 24 bytes (lo: bytes 0..15, hi: 16..23) into
 * bytes 0..7, in memory order (fwd) or reversed (rev, the flip); -128 makes a zero byte.
 */
#define Z -128
static const int8_t fwd[3][2][16] = {
    {{0, 3, 6, 9, 12, 15, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z}, {Z, Z, Z, Z, Z, Z, 2, 5, Z, Z, Z, Z, Z, Z, Z, Z}},
    {{1, 4, 7, 10, 13, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z}, {Z, Z, Z, Z, Z, 0, 3, 6, Z, Z, Z, Z, Z, Z, Z, Z}},
    {{2, 5, 8, 11, 14, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z}, {Z, Z, Z, Z, Z, 1, 4, 7, Z, Z, Z, Z, Z, Z, Z, Z}},
};
static const int8_t rev[3][2][16] = {
    {{Z, Z, 15, 12, 9, 6, 3, 0, Z, Z, Z, Z, Z, Z, Z, Z}, {5, 2, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z}},
    {{Z, Z, Z, 13, 10, 7, 4, 1, Z, Z, Z, Z, Z, Z, Z, Z}, {6, 3, 0, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z}},
    {{Z, Z, Z, 14, 11, 8, 5, 2, Z, Z, Z, Z, Z, Z, Z, Z}, {7, 4, 1, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z, Z}},
};
#undef Z

/* One channel of eight pixels (24 bytes in lo and hi's low 8): its bytes picked by mask, as float32 fma(x, a, b) in two halves. */
__attribute__((target("avx2,fma"))) static inline void channel8(__m128i lo, __m128i hi, const __m128i mask[2], __m256d a,
                                                                __m256d b, __m128 *f0, __m128 *f1) {
  __m128i bytes = _mm_or_si128(_mm_shuffle_epi8(lo, mask[0]), _mm_shuffle_epi8(hi, mask[1]));
  __m128i x0 = _mm_cvtepu8_epi32(bytes), x1 = _mm_cvtepu8_epi32(_mm_srli_si128(bytes, 4));
  *f0 = _mm256_cvtpd_ps(_mm256_fmadd_pd(_mm256_cvtepi32_pd(x0), a, b));
  *f1 = _mm256_cvtpd_ps(_mm256_fmadd_pd(_mm256_cvtepi32_pd(x1), a, b));
}

/* Eight pixels a step. A table gather (vgatherdps) was tried first: slower than scalar table loads on
   this Zen 4. */
__attribute__((target("avx2,fma"))) static void avx2(const uint8_t *q, ptrdiff_t step, int64_t n,
                                                     const sf_normalize *nm, float *const out[3]) {
  const int8_t(*m)[2][16] = step > 0 ? fwd : rev;
  __m128i mask[3][2];
  __m256d a[3], b[3];
  float *o[3];
  for (int c = 0; c < 3; c++) {
    for (int h = 0; h < 2; h++) mask[c][h] = _mm_loadu_si128((const __m128i *)m[c][h]);
    a[c] = _mm256_set1_pd(nm->scale[c]);
    b[c] = _mm256_set1_pd(nm->shift[c]);
    o[c] = out[c];
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint8_t *p = step > 0 ? q + i * 3 : q - i * 3 - 21;
    __m128i lo = _mm_loadu_si128((const __m128i *)p), hi = _mm_loadl_epi64((const __m128i *)(p + 16));
    for (int c = 0; c < 3; c++) {
      __m128 f0, f1;
      channel8(lo, hi, mask[c], a[c], b[c], &f0, &f1);
      _mm256_storeu_ps(o[c] + i, _mm256_set_m128(f1, f0));
    }
  }
  float *const tail[3] = {o[0] + i, o[1] + i, o[2] + i};
  sf_normalize_rgb_f32_scalar(q + i * step, step, n - i, nm, tail);
}

/* bfloat16 of four floats, rounded to nearest even, in the low halves of four int32 lanes. */
__attribute__((target("avx2,fma"))) static inline __m128i bf16_bits(__m128 f) {
  __m128i b = _mm_castps_si128(f);
  b = _mm_add_epi32(b, _mm_add_epi32(_mm_set1_epi32(0x7fff), _mm_and_si128(_mm_srli_epi32(b, 16), _mm_set1_epi32(1))));
  return _mm_srli_epi32(b, 16);
}

__attribute__((target("avx2,fma"))) static void avx2_bf16(const uint8_t *q, ptrdiff_t step, int64_t n,
                                                          const sf_normalize *nm, uint16_t *const out[3]) {
  const int8_t(*m)[2][16] = step > 0 ? fwd : rev;
  __m128i mask[3][2];
  __m256d a[3], b[3];
  for (int c = 0; c < 3; c++) {
    for (int h = 0; h < 2; h++) mask[c][h] = _mm_loadu_si128((const __m128i *)m[c][h]);
    a[c] = _mm256_set1_pd(nm->scale[c]);
    b[c] = _mm256_set1_pd(nm->shift[c]);
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint8_t *p = step > 0 ? q + i * 3 : q - i * 3 - 21;
    __m128i lo = _mm_loadu_si128((const __m128i *)p), hi = _mm_loadl_epi64((const __m128i *)(p + 16));
    for (int c = 0; c < 3; c++) {
      __m128 f0, f1;
      channel8(lo, hi, mask[c], a[c], b[c], &f0, &f1);
      _mm_storeu_si128((__m128i *)(out[c] + i), _mm_packus_epi32(bf16_bits(f0), bf16_bits(f1)));
    }
  }
  for (; i < n; i++)
    for (int c = 0; c < 3; c++) {
      float v = (float)fma((double)q[i * step + c], nm->scale[c], nm->shift[c]);
      __m128i r = bf16_bits(_mm_set1_ps(v));
      out[c][i] = (uint16_t)_mm_cvtsi128_si32(r);
    }
}

/* Bytes 0..15 and 16..23 of eight pixels reversed, from the 24 bytes of lo (0..15) and hi (16..23). */
#define Z -128
static const int8_t flip_lo[16] = {Z, Z, Z, Z, Z, Z, 15, Z, Z, 12, 13, 14, 9, 10, 11, 6};
static const int8_t flip_hi[16] = {5, 6, 7, 2, 3, 4, Z, 0, 1, Z, Z, Z, Z, Z, Z, Z};
static const int8_t flip_tail[16] = {7, 8, 3, 4, 5, 0, 1, 2, Z, Z, Z, Z, Z, Z, Z, Z};
#undef Z

__attribute__((target("ssse3"))) static void flip_u8(const uint8_t *q, int64_t n, uint8_t *out) {
  const __m128i mlo = _mm_loadu_si128((const __m128i *)flip_lo), mhi = _mm_loadu_si128((const __m128i *)flip_hi),
                mtail = _mm_loadu_si128((const __m128i *)flip_tail);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint8_t *p = q - i * 3 - 21;
    __m128i lo = _mm_loadu_si128((const __m128i *)p), hi = _mm_loadl_epi64((const __m128i *)(p + 16));
    _mm_storeu_si128((__m128i *)(out + 3 * i), _mm_or_si128(_mm_shuffle_epi8(lo, mlo), _mm_shuffle_epi8(hi, mhi)));
    _mm_storel_epi64((__m128i *)(out + 3 * i + 16), _mm_shuffle_epi8(lo, mtail));
  }
  for (; i < n; i++) memcpy(out + 3 * i, q - 3 * i, 3);
}

__attribute__((target("ssse3"))) static void planes_u8(const uint8_t *q, ptrdiff_t step, int64_t n,
                                                        uint8_t *const out[3]) {
  const int8_t(*m)[2][16] = step > 0 ? fwd : rev;
  __m128i mask[3][2];
  for (int c = 0; c < 3; c++)
    for (int h = 0; h < 2; h++) mask[c][h] = _mm_loadu_si128((const __m128i *)m[c][h]);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint8_t *p = step > 0 ? q + i * 3 : q - i * 3 - 21;
    __m128i lo = _mm_loadu_si128((const __m128i *)p), hi = _mm_loadl_epi64((const __m128i *)(p + 16));
    for (int c = 0; c < 3; c++)
      _mm_storel_epi64((__m128i *)(out[c] + i),
                       _mm_or_si128(_mm_shuffle_epi8(lo, mask[c][0]), _mm_shuffle_epi8(hi, mask[c][1])));
  }
  for (; i < n; i++)
    for (int c = 0; c < 3; c++) out[c][i] = q[i * step + c];
}
#endif

bool sf_normalize_rgb_bf16(const uint8_t *q, ptrdiff_t step, int64_t n, const sf_normalize *nm,
                           uint16_t *const out[3]) {
#ifdef SF_NORMALIZE_AVX2
  if ((step == 3 || step == -3) && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    avx2_bf16(q, step, n, nm, out);
    return true;
  }
#endif
  (void)q, (void)step, (void)n, (void)nm, (void)out;
  return false;
}

bool sf_normalize_rgb_u8(const uint8_t *q, ptrdiff_t step, int64_t n, uint8_t *out) {
  if (step == 3) {
    memcpy(out, q, (size_t)(3 * n));
    return true;
  }
#ifdef SF_NORMALIZE_AVX2
  if (step == -3 && __builtin_cpu_supports("ssse3")) {
    flip_u8(q, n, out);
    return true;
  }
#endif
  return false;
}

bool sf_normalize_rgb_u8_planes(const uint8_t *q, ptrdiff_t step, int64_t n, uint8_t *const out[3]) {
#ifdef SF_NORMALIZE_AVX2
  if ((step == 3 || step == -3) && __builtin_cpu_supports("ssse3")) {
    planes_u8(q, step, n, out);
    return true;
  }
#endif
  (void)q, (void)step, (void)n, (void)out;
  return false;
}

bool sf_normalize_rgb_f32(const uint8_t *q, ptrdiff_t step, int64_t n, const sf_normalize *nm, float *const out[3]) {
#ifdef SF_NORMALIZE_AVX2
  if ((step == 3 || step == -3) && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    avx2(q, step, n, nm, out);
    return true;
  }
#endif
  (void)q, (void)step, (void)n, (void)nm, (void)out;
  return false;
}
