/* augment's RGB -> float32 CHW pass, with an AVX2+FMA path picked at run time (see normalize.h). */
#include "normalize.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SF_NORMALIZE_X86 1
#endif

bool sf_normalize_matches(const float *table, double scale, double shift) {
  for (int x = 0; x < 256; x++)
    if ((float)fma((double)x, scale, shift) != table[x]) return false;
  return true;
}

/* One row of a block, one pixel at a time. */
static void row_f32_scalar(const uint8_t *q, ptrdiff_t step, int64_t n, const sf_normalize *nm, float *const o[3]) {
  for (int c = 0; c < 3; c++) {
    const double a = nm->scale[c], b = nm->shift[c];
    const uint8_t *p = q + c;
    for (int64_t i = 0; i < n; i++, p += step) o[c][i] = (float)fma((double)*p, a, b);
  }
}

void sf_normalize_rgb_f32_scalar(const sf_rgb_rows *b, const sf_normalize *nm, float *const out[3]) {
  for (int64_t r = 0; r < b->rows; r++) {
    float *const o[3] = {out[0] + r * b->oy, out[1] + r * b->oy, out[2] + r * b->oy};
    row_f32_scalar(b->q + r * b->sy, b->step, b->n, nm, o);
  }
}

#ifdef SF_NORMALIZE_X86
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

/* Where the eight pixels from output pixel i on start in a row read from q with step: their 24 bytes, lowest first. */
static inline const uint8_t *eight_at(const uint8_t *q, ptrdiff_t step, int64_t i) {
  return step > 0 ? q + i * 3 : q - i * 3 - 21;
}

/*
 * The output pixels of a row at which an eight-pixel step starts: 0, 8, ..., and n - 8 for the last
 * pixels when n is not a multiple of 8 (that step overlaps the one before and writes the same values
 * again). Rows shorter than 8 take the scalar path (*count = 0).
 */
static inline int64_t eight_steps(int64_t n) { return n < 8 ? 0 : (n + 7) / 8; }
static inline int64_t eight_start(int64_t n, int64_t k) { return 8 * k + 8 <= n ? 8 * k : n - 8; }

/* bfloat16 of four floats, rounded to nearest even, in the low halves of four int32 lanes. */
__attribute__((target("avx2,fma"))) static inline __m128i bf16_bits(__m128 f) {
  __m128i b = _mm_castps_si128(f);
  b = _mm_add_epi32(b, _mm_add_epi32(_mm_set1_epi32(0x7fff), _mm_and_si128(_mm_srli_epi32(b, 16), _mm_set1_epi32(1))));
  return _mm_srli_epi32(b, 16);
}

/* One bfloat16 of the multiply-add, as the vector path rounds it. */
__attribute__((target("avx2,fma"))) static inline uint16_t bf16_of(uint8_t x, double a, double b) {
  return (uint16_t)_mm_cvtsi128_si32(bf16_bits(_mm_set1_ps((float)fma((double)x, a, b))));
}

/*
 * The source row AHEAD_ROWS on is fetched while this one is written. The source is often a window another
 * core wrote (a resize's output, read when batch writes the row): the CPU's own prefetchers follow a row but
 * stop at each 4 KiB page, a few rows apart (ImageNet-like graph: 3-7% less CPU). Rows of the 6 ahead
 * measured no worse than 12 or 24.
 */
enum { AHEAD_ROWS = 6 };

/*
 * Prefetches the 3n bytes of a row of bl read from q (its first pixel read; the last one when flipped) into
 * L1, or into L2 only (to_l2).
 */
__attribute__((target("avx2,fma"))) static inline void prefetch_row(const sf_rgb_rows *bl, const uint8_t *q,
                                                                    bool to_l2) {
  const uint8_t *lowest = bl->step > 0 ? q : q - 3 * (bl->n - 1);
  for (int64_t at = 0; at < 3 * bl->n; at += 64) {
    if (to_l2)
      _mm_prefetch((const char *)lowest + at, _MM_HINT_T1);
    else
      _mm_prefetch((const char *)lowest + at, _MM_HINT_T0);
  }
}

/*
 * Eight pixels a step, into float32 planes (bf16 false) or bfloat16 ones (true); inlined into each with the
 * flag constant. A table gather (vgatherdps) was tried first: slower than scalar table loads on this Zen 4.
 */
__attribute__((target("avx2,fma"), always_inline)) static inline void kernel(const sf_rgb_rows *bl,
                                                                            const sf_normalize *nm,
                                                                            void *const out[3], bool bf16) {
  const int8_t(*m)[2][16] = bl->step > 0 ? fwd : rev;
  __m128i mask[3][2];
  __m256d a[3], b[3];
  for (int c = 0; c < 3; c++) {
    for (int h = 0; h < 2; h++) mask[c][h] = _mm_loadu_si128((const __m128i *)m[c][h]);
    a[c] = _mm256_set1_pd(nm->scale[c]);
    b[c] = _mm256_set1_pd(nm->shift[c]);
  }
  const int64_t n = bl->n, steps = eight_steps(n);
  for (int64_t r = 0; r < bl->rows; r++) {
    const uint8_t *q = bl->q + r * bl->sy;
    if (r + AHEAD_ROWS < bl->rows) prefetch_row(bl, q + AHEAD_ROWS * bl->sy, false);
    float *const f[3] = {(float *)out[0] + r * bl->oy, (float *)out[1] + r * bl->oy, (float *)out[2] + r * bl->oy};
    uint16_t *const h[3] = {(uint16_t *)out[0] + r * bl->oy, (uint16_t *)out[1] + r * bl->oy,
                            (uint16_t *)out[2] + r * bl->oy};
    if (!steps && !bf16) row_f32_scalar(q, bl->step, n, nm, f);
    for (int64_t i = 0; !steps && bf16 && i < n; i++)
      for (int c = 0; c < 3; c++) h[c][i] = bf16_of(q[i * bl->step + c], nm->scale[c], nm->shift[c]);
    for (int64_t k = 0; k < steps; k++) {
      const int64_t i = eight_start(n, k);
      const uint8_t *p = eight_at(q, bl->step, i);
      __m128i lo = _mm_loadu_si128((const __m128i *)p), hi = _mm_loadl_epi64((const __m128i *)(p + 16));
      for (int c = 0; c < 3; c++) {
        __m128 f0, f1;
        channel8(lo, hi, mask[c], a[c], b[c], &f0, &f1);
        if (bf16)
          _mm_storeu_si128((__m128i *)(h[c] + i), _mm_packus_epi32(bf16_bits(f0), bf16_bits(f1)));
        else
          _mm256_storeu_ps(f[c] + i, _mm256_set_m128(f1, f0));
      }
    }
  }
}

__attribute__((target("avx2,fma"))) static void avx2(const sf_rgb_rows *bl, const sf_normalize *nm,
                                                     float *const out[3]) {
  void *const o[3] = {out[0], out[1], out[2]};
  kernel(bl, nm, o, false);
}

__attribute__((target("avx2,fma"))) static void avx2_bf16(const sf_rgb_rows *bl, const sf_normalize *nm,
                                                          uint16_t *const out[3]) {
  void *const o[3] = {out[0], out[1], out[2]};
  kernel(bl, nm, o, true);
}

/*
 * Blocks at least this large (output bytes) go to the streaming kernel when it applies: an output this
 * size leaves the cache before anything reads it (a batch of 64 ImageNet-sized float32 CHW samples is
 * 38 MiB), so reading each line in before writing it (a plain store's read for ownership) is wasted.
 */
enum { STREAM_BYTES = 256 << 10 };

/*
 * The AVX2 kernel's arithmetic, sixteen pixels a step: channel c of pixel k of the 48 bytes loaded is
 * picked by vpermb (fwd: byte 3k + c; flipped: 3(15 - k) + c); a row's last n % 16 pixels take a masked
 * load and masked stores. With stream (whole 64-byte output lines, aligned: see streams()), each
 * channel's sixteen float32 go out as one non-temporal store (vmovntps), which skips reading the line
 * into the cache first. Measured on a Zen 4 (224 x 224 float32 CHW, output in a 76 MiB ring): 23 us an
 * image with these stores, 37 us with plain 64-byte stores; the AVX2 kernel's 32-byte non-temporal
 * stores were slower than its plain ones (the lines of three planes filled in halves).
 */
__attribute__((target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vbmi"), always_inline)) static inline void
kernel512(const sf_rgb_rows *bl, const sf_normalize *nm, float *const out[3], bool stream) {
  uint8_t pick[3][64] = {{0}};
  __m512i idx[3];
  __m512d a[3], b[3];
  for (int c = 0; c < 3; c++) {
    for (int k = 0; k < 16; k++) pick[c][k] = (uint8_t)(3 * (bl->step > 0 ? k : 15 - k) + c);
    idx[c] = _mm512_loadu_si512(pick[c]);
    a[c] = _mm512_set1_pd(nm->scale[c]);
    b[c] = _mm512_set1_pd(nm->shift[c]);
  }
  const int64_t whole = bl->n & ~(int64_t)15, rest = bl->n - whole;
  /* masked-off bytes are not read (no fault past a row); a flipped tail's bytes are the 3 * rest lowest */
  const __mmask64 bytes48 = 0xFFFFFFFFFFFFull, tail_bytes = (1ull << (3 * rest)) - 1;
  const __mmask16 tail_lanes = (__mmask16)((1u << rest) - 1);
  /*
   * A block this large reads a window (150 KiB for 224 x 224) that a resize wrote on another core: all of
   * it asked into this core's L2 first, the loads wait less (the ImageNet-like graph: -2% CPU, 22
   * interleaved runs); the rows AHEAD_ROWS on still come into L1 as the AVX2 kernel's do.
   */
  for (int64_t r = 0; stream && r < bl->rows; r++) prefetch_row(bl, bl->q + r * bl->sy, true);
  for (int64_t r = 0; r < bl->rows; r++) {
    const uint8_t *q = bl->q + r * bl->sy;
    if (r + AHEAD_ROWS < bl->rows) prefetch_row(bl, q + AHEAD_ROWS * bl->sy, false);
    for (int64_t i = 0; i < bl->n; i += 16) {
      const bool tail = i == whole;
      __m512i px;
      if (!tail)
        px = _mm512_maskz_loadu_epi8(bytes48, bl->step > 0 ? q + i * 3 : q - i * 3 - 45);
      else if (bl->step > 0)
        px = _mm512_maskz_loadu_epi8(tail_bytes, q + i * 3);
      else /* the tail's pixels end at q - 3 i + 3: placed as the last of sixteen, as a whole step reads */
        px = _mm512_maskz_loadu_epi8(tail_bytes << (48 - 3 * rest), q - i * 3 - 45);
      for (int c = 0; c < 3; c++) {
        __m512i x = _mm512_cvtepu8_epi32(_mm512_castsi512_si128(_mm512_permutexvar_epi8(idx[c], px)));
        __m256 lo = _mm512_cvtpd_ps(_mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(x)), a[c], b[c]));
        __m256 hi = _mm512_cvtpd_ps(_mm512_fmadd_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(x, 1)), a[c], b[c]));
        __m512 v = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
        float *o = out[c] + r * bl->oy + i;
        if (tail)
          _mm512_mask_storeu_ps(o, tail_lanes, v);
        else if (stream)
          _mm512_stream_ps(o, v);
        else
          _mm512_storeu_ps(o, v);
      }
    }
  }
  if (stream) _mm_sfence(); /* the stores are weakly ordered: done before the block is handed to another thread */
}

__attribute__((target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vbmi"))) static void
avx512(const sf_rgb_rows *bl, const sf_normalize *nm, float *const out[3]) {
  kernel512(bl, nm, out, false);
}

__attribute__((target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vbmi"))) static void
stream512(const sf_rgb_rows *bl, const sf_normalize *nm, float *const out[3]) {
  kernel512(bl, nm, out, true);
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

static atomic_int isa_limit = SF_NORMALIZE_AVX512;

void sf_normalize_limit(sf_normalize_isa isa) { atomic_store_explicit(&isa_limit, isa, memory_order_relaxed); }

/* The widest kernels this CPU runs, within sf_normalize_limit's and SF_NORMALIZE_ISA's limits. */
static sf_normalize_isa isa(void) {
  static atomic_int found = -1;
  int f = atomic_load_explicit(&found, memory_order_relaxed);
  if (f < 0) {
    f = SF_NORMALIZE_SCALAR;
#ifdef SF_NORMALIZE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) f = SF_NORMALIZE_AVX2;
    if (f == SF_NORMALIZE_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi"))
      f = SF_NORMALIZE_AVX512;
#endif
    const char *e = getenv("SF_NORMALIZE_ISA");
    if (e && !strcmp(e, "scalar")) f = SF_NORMALIZE_SCALAR;
    if (e && !strcmp(e, "avx2") && f > SF_NORMALIZE_AVX2) f = SF_NORMALIZE_AVX2;
    atomic_store_explicit(&found, f, memory_order_relaxed);
  }
  int limit = atomic_load_explicit(&isa_limit, memory_order_relaxed);
  return f < limit ? f : limit;
}

/* Whether the block has the AVX2 (with FMA) kernels here; uint8 output needs only SSSE3, which AVX2 implies. */
static bool simd(const sf_rgb_rows *b) {
  return (b->step == 3 || b->step == -3) && isa() >= SF_NORMALIZE_AVX2;
}

/* Whether a block the AVX-512 kernel takes streams: large enough, whole 64-byte lines (16 floats) a row, aligned rows. */
static bool streams(const sf_rgb_rows *b, float *const out[3]) {
  if (b->n % 16 || b->oy % 16 || 3 * b->rows * b->n * (int64_t)sizeof(float) < STREAM_BYTES) return false;
  for (int c = 0; c < 3; c++)
    if ((uintptr_t)out[c] % 64) return false;
  return true;
}

bool sf_normalize_rgb_f32(const sf_rgb_rows *b, const sf_normalize *nm, float *const out[3]) {
  if (!simd(b)) return false;
#ifdef SF_NORMALIZE_X86
  if (isa() < SF_NORMALIZE_AVX512 || b->n < 16)
    avx2(b, nm, out);
  else if (streams(b, out))
    stream512(b, nm, out);
  else
    avx512(b, nm, out);
#endif
  return true;
}

bool sf_normalize_rgb_bf16(const sf_rgb_rows *b, const sf_normalize *nm, uint16_t *const out[3]) {
  if (!simd(b)) return false;
#ifdef SF_NORMALIZE_X86
  avx2_bf16(b, nm, out);
#endif
  return true;
}

bool sf_normalize_rgb_u8(const sf_rgb_rows *b, uint8_t *out) {
  if (b->step == 3) {
    for (int64_t r = 0; r < b->rows; r++) memcpy(out + r * b->oy, b->q + r * b->sy, (size_t)(3 * b->n));
    return true;
  }
  if (!simd(b)) return false;
#ifdef SF_NORMALIZE_X86
  for (int64_t r = 0; r < b->rows; r++) flip_u8(b->q + r * b->sy, b->n, out + r * b->oy);
#endif
  return true;
}

bool sf_normalize_rgb_u8_planes(const sf_rgb_rows *b, uint8_t *const out[3]) {
  if (!simd(b)) return false;
#ifdef SF_NORMALIZE_X86
  for (int64_t r = 0; r < b->rows; r++) {
    uint8_t *const o[3] = {out[0] + r * b->oy, out[1] + r * b->oy, out[2] + r * b->oy};
    planes_u8(b->q + r * b->sy, b->step, b->n, o);
  }
#endif
  return true;
}
