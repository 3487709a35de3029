/* What the image decoders share (image_formats.h): size checks, pixel allocation, channel conversions. */
#include <stdint.h>
#include <string.h>

#include "image_formats.h"

#define DEFAULT_MAX_PIXELS 100000000

int64_t sf_image_max_pixels(const sf_image_limits *limits) {
  return limits && limits->max_pixels > 0 ? limits->max_pixels : DEFAULT_MAX_PIXELS;
}

int sf_image_check_pixels(int64_t width, int64_t height, const sf_image_limits *limits, const char *what,
                          sf_error *error) {
  int64_t max = sf_image_max_pixels(limits);
  if (width <= 0 || height <= 0)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "%s has no pixels (%lldx%lld)", what, (long long)width,
                        (long long)height);
  if (width > max || height > max / width)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE,
                        "%s is %lldx%lld pixels, over max_pixels %lld; raise max_pixels if it is genuine", what,
                        (long long)width, (long long)height, (long long)max);
  return 0;
}

void sf_image_rgb_to_gray(const uint8_t *src, int src_channels, uint8_t *dst, size_t pixels) {
  for (size_t i = 0; i < pixels; i++, src += src_channels) dst[i] = sf_image_luma(src);
}

void sf_image_gray_to_rgb(const uint8_t *src, uint8_t *dst, size_t pixels) {
  for (size_t i = 0; i < pixels; i++, dst += 3) dst[0] = dst[1] = dst[2] = src[i];
}

int sf_image_channels_for(sf_image_mode mode, int stored) {
  switch (mode) {
  case SF_IMAGE_RGB: return 3;
  case SF_IMAGE_GRAY: return 1;
  default: return stored;
  }
}

int sf_image_alloc_of(sf_tensor *out, sf_dtype dtype, int64_t height, int64_t width, int channels,
                          sf_error *error) {
  int r = sf_pixels_alloc(out, dtype, height, width, channels);
  if (r < 0)
    return sf_error_set(error, r, SF_NOWHERE, "cannot allocate a %lldx%lldx%d image", (long long)height,
                        (long long)width, channels);
  return 0;
}

int sf_image_alloc(sf_tensor *out, int64_t height, int64_t width, int channels, sf_error *error) {
  return sf_image_alloc_of(out, SF_DTYPE_UINT8, height, width, channels, error);
}

bool sf_image_wants_16(const sf_image_limits *limits) { return limits && (limits->depth == 16 || limits->depth < 0); }

/* Pillow's MULDIV255 (ImagingUtils.h): a * b / 255, rounded its way. */
static inline int muldiv255(int a, int b) {
  int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

/*
 * Adobe-inverted CMYK (what libjpeg hands out for CMYK and YCCK files with the Adobe marker) to
 * RGB exactly as Pillow: it un-inverts ("CMYK;I") and then applies cmyk2rgb, R = (255 - K) -
 * (C * (255 - K)) / 255.
 */
void sf_image_cmyk_to_rgb(const uint8_t *src, uint8_t *dst, size_t pixels) {
  for (size_t i = 0; i < pixels; i++, src += 4, dst += 3) {
    int nk = src[3];
    for (int c = 0; c < 3; c++)
      dst[c] = (uint8_t)(nk - muldiv255(255 - src[c], nk));
  }
}
