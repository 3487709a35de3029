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
 * Writes n output pixels of one row: out[c][i] = (float)fma(q[i * step + c], nm->scale[c],
 * nm->shift[c]) for c = 0, 1, 2. q points at channel 0 of the first pixel read, whose channels are
 * adjacent bytes (RGB, HWC); step is the byte distance to the next pixel read: 3, or -3 for a
 * horizontal flip (the reversed walk). out[c] is channel c's plane row (float32, contiguous).
 * Only on an x86-64 CPU with AVX2 and FMA: eight pixels at a time (24 bytes loaded, never past
 * the row; byte shuffles, int32 -> double, multiply-add, -> float32), the same bits as the scalar
 * function. Returns true when it wrote the row, false (nothing written) when there is no such
 * path here or step is not +-3: the caller then uses its tables. Borrows everything; cannot fail.
 */
bool sf_normalize_rgb_f32(const uint8_t *q, ptrdiff_t step, int64_t n, const sf_normalize *nm, float *const out[3]);

/*
 * bfloat16 output: the same row as sf_normalize_rgb_f32, each float32 then rounded to bfloat16
 * (nearest even: the upper 16 bits after adding 0x7fff plus the lowest kept bit; values are
 * finite), as augment's bf16 tables hold. Same conditions, return value and ownership.
 */
bool sf_normalize_rgb_bf16(const uint8_t *q, ptrdiff_t step, int64_t n, const sf_normalize *nm,
                           uint16_t *const out[3]);

/* The same row, one pixel at a time (the portable path, and the unit test's second opinion). */
void sf_normalize_rgb_f32_scalar(const uint8_t *q, ptrdiff_t step, int64_t n, const sf_normalize *nm,
                                 float *const out[3]);

/*
 * uint8 output, the pixel values kept: n pixels of one row as in sf_normalize_rgb_f32 (q, step = 3
 * or -3), written interleaved to out (HWC: out[3 * i + c]) or as three planes (CHW: out[c][i]).
 * Step 3 into HWC is a copy; a flip (step -3) or planes take eight pixels at a time with byte
 * shuffles on an x86-64 CPU with SSSE3 (24 bytes loaded and stored, never past the row). Return
 * true when they wrote the row, false (nothing written) when there is no such path here or step
 * is not +-3: the caller then copies pixel by pixel. Borrow everything; cannot fail.
 */
bool sf_normalize_rgb_u8(const uint8_t *q, ptrdiff_t step, int64_t n, uint8_t *out);
bool sf_normalize_rgb_u8_planes(const uint8_t *q, ptrdiff_t step, int64_t n, uint8_t *const out[3]);

#endif
