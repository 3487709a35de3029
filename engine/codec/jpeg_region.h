/* JPEG fields left undecoded until the crop is known: decode only the region a crop keeps (libjpeg API). */
#ifndef SF_ENGINE_JPEG_REGION_H
#define SF_ENGINE_JPEG_REGION_H

#include <stdint.h>

#include "image.h"
#include "shardflow/sample.h"

/*
 * The recipe of a deferred JPEG field (see sf_field): the encoded bytes and how decode would have
 * decoded them. The field's header is uint8 [height, width, channels], as sf_image_decode would
 * give. Its write() decodes the whole image (the fallback when no crop comes); augment instead
 * asks for a region with sf_jpeg_decode_region().
 */
typedef struct sf_jpeg_source {
  sf_field_recipe base;
  sf_tensor bytes;          /* owned reference: uint8 [n], the encoded member */
  sf_image_mode mode;
  sf_image_limits limits;
  int width, height, channels;
} sf_jpeg_source;

/*
 * Makes field f (encoded JPEG bytes in f->tensor) a deferred field whose recipe is an
 * sf_jpeg_source, when the region path applies: a baseline (not progressive) 8-bit JPEG in gray
 * or YCbCr/RGB (not CMYK/YCCK), mode rgb or gray, depth 8, no DCT downscaling (min_size 0),
 * within max_pixels. Returns 1 when deferred, 0 when not (f untouched: decode it as before; a
 * corrupt header is left to sf_image_decode, which reports it), SF_ENOMEM.
 */
int sf_jpeg_defer(sf_field *f, sf_image_mode mode, const sf_image_limits *limits);

/* The field's JPEG recipe when f is a deferred JPEG made by sf_jpeg_defer(), else NULL (borrowed). */
const sf_jpeg_source *sf_jpeg_source_of(const sf_field *f);

/*
 * Decodes only box = {top, left, height, width} (pixels of the full image) at the smallest DCT
 * scale M/8 (M = 1..8) whose scaled box still has at least min_h x min_w pixels (the target
 * size; M = 8 when the box is smaller than the target). The scaled box's edges are rounded to
 * whole pixels (at most half a scaled pixel off). *out gets a new uint8 [rows, cols, channels]
 * image (caller owns) of which the scaled box is rows [0, rows) and columns
 * [*x0, *x0 + *span_x): libjpeg widens the columns to whole iMCUs. Returns 0, SF_ENOMEM or
 * SF_EFORMAT (corrupt data; *error has libjpeg's message).
 */
int sf_jpeg_decode_region(const sf_jpeg_source *src, const int64_t box[4], int64_t min_h, int64_t min_w,
                          sf_tensor *out, int64_t *x0, int64_t *span_x, sf_error *error);

#endif
