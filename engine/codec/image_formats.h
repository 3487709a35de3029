/* What engine/codec's image decoders share (image.c, image_tiff.c, image_gif.c, image_j2k.c, image_web.c). */
#ifndef SF_ENGINE_IMAGE_FORMATS_H
#define SF_ENGINE_IMAGE_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "image.h"
#include "pixels.h"

/* ITU-R 601-2 luma in Pillow's 16-bit fixed point (Convert.c L24), so gray output matches convert('L'). */
static inline uint8_t sf_image_luma(const uint8_t *rgb) {
  return (uint8_t)((rgb[0] * 19595u + rgb[1] * 38470u + rgb[2] * 7471u + 0x8000u) >> 16);
}

/* limits->max_pixels, or the default (100 million) when limits is NULL or gives none. */
int64_t sf_image_max_pixels(const sf_image_limits *limits);
/* 0 when width x height is positive and within max_pixels, else an error naming `what` (the format). */
int sf_image_check_pixels(int64_t width, int64_t height, const sf_image_limits *limits, const char *what,
                          sf_error *error);
/* Pixels of RGB(A) (src_channels apart) to gray with sf_image_luma; gray to RGB; Adobe-inverted CMYK to RGB (Pillow's). */
void sf_image_rgb_to_gray(const uint8_t *src, int src_channels, uint8_t *dst, size_t pixels);
void sf_image_gray_to_rgb(const uint8_t *src, uint8_t *dst, size_t pixels);
void sf_image_cmyk_to_rgb(const uint8_t *src, uint8_t *dst, size_t pixels);
/* The output channels for mode of an image that stores `stored` (keep: as stored). */
int sf_image_channels_for(sf_image_mode mode, int stored);
/* *out a new [height, width, channels] image of dtype (uint8 for sf_image_alloc) from the pixel pool; errors say its size. */
int sf_image_alloc_of(sf_tensor *out, sf_dtype dtype, int64_t height, int64_t width, int channels, sf_error *error);
int sf_image_alloc(sf_tensor *out, int64_t height, int64_t width, int channels, sf_error *error);
/* Whether limits ask for 16-bit samples where the format has them (depth 16 or native). */
bool sf_image_wants_16(const sf_image_limits *limits);

/*
 * The decoders of sf_image_decode: the n bytes at p as an image in *out (mode, limits as sf_image_decode
 * takes them). Each returns 0 or an error code with *error set and *out cleared.
 */
bool sf_image_is_webp(const uint8_t *p, size_t n);
bool sf_image_is_avif(const uint8_t *p, size_t n);
bool sf_image_is_jxl(const uint8_t *p, size_t n);
bool sf_image_is_jp2(const uint8_t *p, size_t n); /* a JP2 file (a bare codestream starts FF 4F FF 51) */
int sf_image_decode_webp(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                         sf_tensor *out, sf_error *error);
int sf_image_decode_tiff(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                         sf_tensor *out, sf_error *error);
int sf_image_decode_gif(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                        sf_tensor *out, sf_error *error);
/* Every frame, [T, H, W, C] (decode's `frames: all`). */
int sf_image_decode_gif_frames(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                               sf_tensor *out, sf_error *error);
/* jp2: a JP2 file (else a bare codestream). */
int sf_image_decode_j2k(const uint8_t *p, size_t n, bool jp2, sf_image_mode mode, const sf_image_limits *limits,
                        sf_tensor *out, sf_error *error);
int sf_image_decode_avif(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                         sf_tensor *out, sf_error *error);
int sf_image_decode_jxl(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                        sf_tensor *out, sf_error *error);

#endif
