/* Image codecs shared by the decode stage, `shardflow write` and the device sink's preview grid. */
#ifndef SF_ENGINE_IMAGE_H
#define SF_ENGINE_IMAGE_H

#include <stdbool.h>
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
  int depth;                /* sample depth of the result: 8 (or 0) uint8, 16-bit sources cut to their high byte;
                               16 uint16 always (8-bit samples times 257); -1 "native": uint16 for 16-bit
                               PNG, TIFF, gray JPEG 2000 and PGM/PPM with maxval > 255, uint8 otherwise */
  bool gif_frames;          /* GIF: every frame as a uint8 [T, H, W, C] tensor (as Pillow's ImageSequence
                               composes them), max_pixels bounding T x H x W; false: the first frame [H, W, C] */
} sf_image_limits;

/*
 * Decodes an encoded image into a uint8 (or, by limits->depth, uint16) [H, W, C] tensor (*out, caller owns).
 * `buffer` holds the encoded bytes at [offset, offset+size); for binary
 * PPM/PGM in the requested mode the result is a view of that buffer (no copy,
 * a new reference is taken). Formats: JPEG (TurboJPEG; a warning is an error,
 * except slack bytes before the end-of-image marker), PNG (libspng with size and chunk limits, CRC checked), WebP
 * (libwebp, still images, lossy or lossless, alpha kept in mode keep; animated ones are SF_EUNSUPPORTED), TIFF
 * (libtiff, first page; 16-bit gray/RGB/RGBA as uint16 when depth asks, like PNG), GIF (giflib, first frame on
 * its screen-sized canvas, as Pillow, or every frame when limits->gif_frames asks: then depth is ignored), JPEG 2000 (openjpeg, codestream or JP2, 1-4 full-size components; gray
 * deeper than 8 bits as uint16 when depth asks), AVIF (libavif with dav1d, first image, 8-bit RGB(A) as avifdec
 * converts it), JPEG XL (libjxl, first frame, 8-bit as djxl writes it), PPM (P6)
 * and PGM (P5), 8-bit, or 16-bit (maxval > 255, big-endian samples kept as stored, not rescaled) when
 * depth asks for 16 bits. CMYK/YCCK JPEGs are taken as Adobe-inverted (as libjpeg writes them and
 * Pillow reads them) and converted to RGB with Pillow's formula (Convert.c cmyk2rgb).
 * Returns 0; SF_EFORMAT for corrupt data; SF_ETOOBIG over max_pixels; SF_EUNSUPPORTED for e.g. a
 * 16-bit PNM at depth 8 or gray output from a 16-bit color image. *error has a message (no URL).
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
