/* augment's table pass for the common case: interleaved RGB bytes to three float32 planes (CHW). */
#ifndef SF_ENGINE_NORMALIZE_H
#define SF_ENGINE_NORMALIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * An affine map of bytes to float32 per channel: (float)fma(x, scale, shift) in double, one
 * rounding to float at the end. augment's tables hold (float)((x/255 - mean)/std) computed in
 * double; this map is used only where sf_normalize_matches says it gives each of the 256 table
 * entries bit for bit (a float32 multiply-add does not: it differs in 126..233 of 256 entries).
 */
typedef struct sf_normalize {
  double scale[3], shift[3];
} sf_normalize;

/*
 * Whether (float)fma(x, scale, shift) equals table[x] for every byte x (table: 256 float32).
 * Returns true or false; borrows table.
 */
bool sf_normalize_matches(const float *table, double scale, double shift);

/*
 * The kernels in use: pixel by pixel (the functions below return false and the caller uses its
 * tables), AVX2 with FMA (SSSE3 for uint8, which AVX2 implies), and for float32 rows of 16 pixels
 * or more AVX-512 (F, BW, DQ, VBMI: vpermb picks the channels of 16 pixels a step), which writes
 * blocks of 256 KiB and more with whole aligned 64-byte lines (an ImageNet-sized sample) by
 * non-temporal stores. Picked once from the CPU; the environment variable SF_NORMALIZE_ISA=scalar
 * (or =avx2) forces the first (or at most AVX2) for a whole run (to compare them), and
 * sf_normalize_limit narrows the pick from then on in this process (tests run each kernel). An
 * earlier AVX-512F kernel that shuffled as the AVX2 one does measured slower on a Zen 4 than AVX2;
 * vpermb's one pick per channel and the non-temporal stores are what this one gains by (the same
 * binary with SF_NORMALIZE_ISA=avx2 and without, interleaved: the CIFAR graph -5% CPU, the
 * ImageNet-like graph -0.7% to -3.3%).
 */
typedef enum sf_normalize_isa { SF_NORMALIZE_SCALAR, SF_NORMALIZE_AVX2, SF_NORMALIZE_AVX512 } sf_normalize_isa;
void sf_normalize_limit(sf_normalize_isa isa);

/*
 * A block of RGB rows to write: `rows` rows of n output pixels each. Row r reads from q + r * sy:
 * channel 0 of its first pixel read, whose channels are adjacent bytes (RGB, HWC); step is the byte
 * distance to the next pixel read: 3, or -3 for a horizontal flip (the reversed walk). Row r is
 * written oy elements (float32, bfloat16 or bytes, as the function's output) after row 0 of each
 * output. One call per block rather than per row: a kernel's set-up happens once, and the last
 * pixels of a row (n not a multiple of 8) go through the vector path again, overlapping, instead of
 * a scalar loop; small images (CIFAR's 32 x 32) spend most of their time there otherwise.
 */
typedef struct sf_rgb_rows {
  const uint8_t *q;
  ptrdiff_t sy, step;
  int64_t n, rows;
  ptrdiff_t oy;
} sf_rgb_rows;

/*
 * Writes the block b: out[c][r * oy + i] = (float)fma(q[r * sy + i * step + c], nm->scale[c],
 * nm->shift[c]) for c = 0, 1, 2. out[c] is channel c's plane (float32, each row contiguous).
 * Only on an x86-64 CPU with AVX2 and FMA: eight pixels at a time (24 bytes loaded, never past
 * a row; byte shuffles, int32 -> double, multiply-add, -> float32), the same bits as the scalar
 * function; sixteen at a time with AVX-512 for rows of 16 pixels or more (48 bytes loaded, the last
 * n % 16 pixels by masked loads and stores), and for a block of 256 KiB or more whose n is a multiple
 * of 16 and whose output rows start 64-byte aligned (planes and oy) its lines written past the cache
 * (non-temporal, then a store fence before returning). Returns true when it wrote the block,
 * false (nothing written) when there is no such path here or step is not +-3: the caller then
 * uses its tables. Borrows everything; cannot fail.
 */
bool sf_normalize_rgb_f32(const sf_rgb_rows *b, const sf_normalize *nm, float *const out[3]);

/*
 * bfloat16 output: the same block as sf_normalize_rgb_f32, each float32 then rounded to bfloat16
 * (nearest even: the upper 16 bits after adding 0x7fff plus the lowest kept bit; values are
 * finite), as augment's bf16 tables hold. Same conditions, return value and ownership.
 */
bool sf_normalize_rgb_bf16(const sf_rgb_rows *b, const sf_normalize *nm, uint16_t *const out[3]);

/* The same block, one pixel at a time (the portable path, and the unit test's second opinion). */
void sf_normalize_rgb_f32_scalar(const sf_rgb_rows *b, const sf_normalize *nm, float *const out[3]);

/*
 * uint8 output, the pixel values kept: the block b as in sf_normalize_rgb_f32, written interleaved
 * to out (HWC: out[r * oy + 3 * i + c]) or as three planes (CHW: out[c][r * oy + i]). Step 3 into
 * HWC is a copy; a flip (step -3) or planes take eight pixels at a time with byte shuffles on an
 * x86-64 CPU with SSSE3 (24 bytes loaded and stored, never past a row). Return true when they
 * wrote the block, false (nothing written) when there is no such path here or step is not +-3: the
 * caller then copies pixel by pixel. Borrow everything; cannot fail.
 */
bool sf_normalize_rgb_u8(const sf_rgb_rows *b, uint8_t *out);
bool sf_normalize_rgb_u8_planes(const sf_rgb_rows *b, uint8_t *const out[3]);

#endif
