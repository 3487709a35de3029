/* Image codecs shared by the decode stage, `shardflow write` and the device sink's preview grid. */
#ifndef SF_ENGINE_IMAGE_H
#define SF_ENGINE_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "shardflow/error.h"
#include "shardflow/tensor.h"

typedef enum sf_image_mode {
  SF_IMAGE_RGB = 0,  /* 3 channels */
  SF_IMAGE_GRAY,     /* 1 channel */
  SF_IMAGE_KEEP,     /* as stored: 1 (gray), 3 (RGB) or 4 (RGBA) channels */
} sf_image_mode;

typedef struct sf_image_limits {
  int64_t max_pixels;       /* refuse larger images before allocating (0 = 100 megapixels) */
  int max_scans;            /* progressive JPEG scan limit (0 = 500) */
  int min_size;             /* JPEG DCT-domain downscaling: smallest scale whose both sides stay >= min_size (0 = off) */
} sf_image_limits;

/*
 * Decodes an encoded image into a uint8 [H, W, C] tensor (*out, caller owns).
 * `buffer` holds the encoded bytes at [offset, offset+size); for binary
 * PPM/PGM in the requested mode the result is a view of that buffer (no copy,
 * a new reference is taken). Formats: JPEG (TurboJPEG; a warning is an error,
 * except slack bytes before the end-of-image marker), PNG (libspng with size and chunk limits, CRC checked), PPM (P6)
 * and PGM (P5), 8-bit. Returns 0; SF_EFORMAT for corrupt data; SF_ETOOBIG over
 * max_pixels; SF_EUNSUPPORTED for e.g. 16-bit PNM. *error has a message (no URL).
 */
int sf_image_decode(const char *format, sf_buffer *buffer, size_t offset, size_t size,
                    sf_image_mode mode, const sf_image_limits *limits, sf_tensor *out,
                    sf_error *error);

/* True when format (a field name's last extension) names an image this module decodes. */
int sf_image_format_known(const char *format);

/*
 * Encodes a uint8 [H, W, C] tensor (C = 1 or 3) as "ppm"/"pgm" (binary),
 * "png" (libspng) or "jpg" (TurboJPEG, quality 1..100). Returns 0 with *out a
 * new buffer (caller owns), or SF_EINVAL / SF_ENOMEM / SF_EFORMAT.
 */
int sf_image_encode(const char *format, const sf_tensor *image, int quality, sf_buffer **out,
                    sf_error *error);

#endif
