/*
 * Antialiased separable resize of uint8 images, as PIL's Image.resize(size, Image.BILINEAR)
 * (with reducing_gap=None) and so torchvision's default Resize / RandomResizedCrop on PIL images.
 * Source of the algorithm: Pillow's src/libImaging/Resample.c (ImagingResample: precompute_coeffs,
 * normalize_coeffs_8bpc, ImagingResampleHorizontal_8bpc / Vertical_8bpc): a triangle filter whose
 * support grows with the downscale factor, weights normalised per output pixel and rounded to
 * 22-bit fixed point, a horizontal pass then a vertical pass, each rounded and clamped to uint8.
 * Same coefficients and order, so results equal PIL's bit for bit for 1- and 3-channel images;
 * channels are resampled independently (PIL premultiplies alpha of RGBA images, this does not).
 */
#ifndef SF_ENGINE_RESIZE_H
#define SF_ENGINE_RESIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * One axis of a resize: the source pixels [origin, origin+span) are resampled to `size` pixels, of
 * which outputs [first, first+n) are computed (a crop of the resized image costs only its window).
 * Requires span >= 1, size >= 1, 0 <= first, first+n <= size, n >= 1. When span == size the
 * axis is copied, not filtered.
 */
typedef struct sf_resize_axis {
  int64_t origin, span, size, first, n;
} sf_resize_axis;

/*
 * The source pixels [*lo, *hi) (origin included) that sf_resize_u8 reads along axis a for its outputs
 * [first, first+n): a caller that decodes only part of an image decodes these. Requirements as above.
 */
void sf_resize_reads(const sf_resize_axis *a, int64_t *lo, int64_t *hi);

/*
 * Resizes the uint8 image at src (c channels, 1 <= c <= 16, byte strides sy between rows, sx
 * between pixels, sc between channels) along ay and ax into dst, a contiguous [ay.n, ax.n, c] HWC
 * uint8 buffer owned by the caller. Borrows src and dst for the call only. Returns 0, or SF_ENOMEM
 * (scratch for the coefficients and the horizontal pass's rows is allocated per call) with dst
 * unspecified. On x86-64 CPUs with AVX2 its inner loops are AVX2 kernels (the horizontal one for
 * 3-channel pixels 3 bytes apart), unless the environment variable SF_RESIZE_PORTABLE is set
 * non-empty (read at the first call): then the portable C loops run. Both give PIL's result.
 */
int sf_resize_u8(const uint8_t *src, ptrdiff_t sy, ptrdiff_t sx, ptrdiff_t sc, int c, const sf_resize_axis *ay,
                 const sf_resize_axis *ax, uint8_t *dst);

/*
 * sf_resize_u8 with simd false: the portable C loops whatever the CPU (bench/resize_bench compares
 * the two); with simd true, the same as sf_resize_u8.
 */
int sf_resize_u8_simd(const uint8_t *src, ptrdiff_t sy, ptrdiff_t sx, ptrdiff_t sc, int c, const sf_resize_axis *ay,
                      const sf_resize_axis *ax, uint8_t *dst, bool simd);

#endif
