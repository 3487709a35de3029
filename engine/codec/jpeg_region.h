/* JPEG fields left undecoded until the crop is known: decode only the region a crop keeps (libjpeg API). */
#ifndef SF_ENGINE_JPEG_REGION_H
#define SF_ENGINE_JPEG_REGION_H

#include <stdbool.h>
#include <stdint.h>

#include "image.h"
#include "shardflow/sample.h"

/*
 * An undecoded JPEG and how decode would have decoded it (the lazy module's JPEG kind holds one): the
 * decoded image is uint8 [height, width, channels], as sf_image_decode would give.
 */
typedef struct sf_jpeg_source {
  sf_tensor bytes;          /* owned reference: uint8 [n], the encoded member */
  sf_image_mode mode;
  sf_image_limits limits;
  int width, height, channels;
} sf_jpeg_source;

/*
 * Fills *out (taking a reference to bytes) when the region path applies to the encoded JPEG in bytes
 * (uint8 [n]): a baseline (not progressive) 8-bit JPEG in gray or YCbCr/RGB (not CMYK/YCCK), mode rgb
 * or gray, depth 8, no DCT downscaling (min_size 0), within max_pixels. Returns 1 when it applies, 0
 * when not (*out untouched; a corrupt header is left to sf_image_decode, which reports it).
 */
int sf_jpeg_probe(const sf_tensor *bytes, sf_image_mode mode, const sf_image_limits *limits, sf_jpeg_source *out);

/* sf_jpeg_dct_scale and sf_jpeg_scaled (DCT scale arithmetic) are public: include/shardflow/codec.h. */

/*
 * Decodes rows [rect[0], rect[2]) and columns [rect[1], rect[3]) of the image decoded at scale m/8
 * (libjpeg's jpeg_skip_scanlines and jpeg_crop_scanline: only the iMCU columns the rectangle touches are
 * decoded, and rows below it not at all). libjpeg starts at the iMCU row the rectangle needs where the JPEG's
 * scan can be resumed there: the rows above are walked over once per JPEG, their entries kept for its later
 * regions (jpeg_scan.h, jpeg_entries.h). Accurate integer IDCT and fancy upsampling, as TurboJPEG's
 * defaults: at m = 8 the pixels equal sf_image_decode()'s; fast instead takes libjpeg's fast integer IDCT
 * (JDCT_IFAST), with fancy upsampling still: less CPU, other pixels. *out gets a new uint8
 * [rows, cols, channels] image (caller owns) whose column *x0 is the rectangle's column rect[1];
 * libjpeg widens the columns to whole iMCUs. Returns 0, SF_ENOMEM, or SF_EFORMAT for corrupt data
 * met in the rows read (data outside them is not checked) with libjpeg's message in *error.
 */
int sf_jpeg_decode_region(const sf_jpeg_source *src, int m, bool fast, const int64_t rect[4], sf_tensor *out,
                          int64_t *x0, sf_error *error);

#endif
