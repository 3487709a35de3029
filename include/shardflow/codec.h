/*
 * shardflow's codecs for stages: image decode (and encode), .npy/.npz arrays, JPEGs left undecoded until
 * their crop is known, and the one-pass image transform (crop, resize, flip, normalise, dtype and layout
 * written into a caller's buffer). The built-in decode and augment stages are written against this
 * header, and a plugin (a video reader, a user's own augment) can call the same functions.
 */
#ifndef SHARDFLOW_CODEC_H
#define SHARDFLOW_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shardflow/buffer.h"
#include "shardflow/error.h"
#include "shardflow/sample.h"
#include "shardflow/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- images ------------------------------------------------------------------------------------ */

/** The channels an image is decoded to. */
typedef enum sf_image_mode {
  SF_IMAGE_RGB = 0, /**< 3 channels */
  SF_IMAGE_GRAY,    /**< 1 channel */
  SF_IMAGE_KEEP,    /**< as stored: 1 (gray), 3 (RGB) or 4 (RGBA) channels */
} sf_image_mode;

/**
 * Limits and options of one decode; a zeroed struct gives the defaults. Its layout is part of the stage ABI
 * (a change bumps SF_STAGE_ABI_VERSION, stage.h).
 */
typedef struct sf_image_limits {
  int64_t max_pixels;       /**< refuse larger images before allocating (0 = 100 megapixels) */
  int max_scans;            /**< progressive JPEG scan limit (0 = 500) */
  int min_size;             /**< JPEG DCT-domain downscaling: smallest scale whose both sides stay >= min_size
                                 pixels (0 = off) */
  int depth;                /**< sample depth of the result: 8 (or 0) uint8, 16-bit sources cut to their high
                                 byte; 16 uint16 always (8-bit samples times 257); -1 "native": uint16 for 16-bit
                                 PNG, TIFF, gray JPEG 2000 and PGM/PPM with maxval > 255, uint8 otherwise */
  bool gif_frames;          /**< GIF: every frame as a uint8 [T, H, W, C] tensor (as Pillow's ImageSequence
                                 composes them), max_pixels bounding T x H x W; false: the first frame [H, W, C] */
} sf_image_limits;

/**
 * Decodes an encoded image into a uint8 (or, by limits->depth, uint16) [H, W, C] tensor (*out, caller owns;
 * clear it with sf_tensor_clear). `buffer` holds the encoded bytes at [offset, offset+size); for binary
 * PPM/PGM in the requested mode the result is a view of that buffer (no copy, a new reference is taken).
 * format is the field name's last extension ("jpg", "png"...; sf_image_format_known). Formats: JPEG
 * (TurboJPEG; a warning is an error, except slack bytes before the end-of-image marker), PNG (libspng with
 * size and chunk limits, CRC checked), WebP (libwebp, still images, lossy or lossless, alpha kept in mode
 * keep; animated ones are SF_EUNSUPPORTED), TIFF (libtiff, first page; 16-bit gray/RGB/RGBA as uint16 when
 * depth asks, like PNG), GIF (giflib, first frame on its screen-sized canvas, as Pillow, or every frame when
 * limits->gif_frames asks: then depth is ignored), JPEG 2000
 * (openjpeg, codestream or JP2, 1-4 full-size components; gray deeper than 8 bits as uint16 when depth
 * asks), AVIF (libavif with dav1d, first image, 8-bit RGB(A) as avifdec converts it), JPEG XL (libjxl, first
 * frame, 8-bit as djxl writes it), PPM (P6) and PGM (P5), 8-bit, or 16-bit (maxval > 255, big-endian
 * samples kept as stored, not rescaled) when depth asks for 16 bits. CMYK/YCCK JPEGs are taken as
 * Adobe-inverted (as libjpeg writes them and Pillow reads them) and converted to RGB with Pillow's formula.
 * limits NULL (or a zeroed struct) gives the defaults. Returns 0; SF_EFORMAT for corrupt data;
 * SF_ETOOBIG over max_pixels; SF_EUNSUPPORTED for e.g. a 16-bit PNM at depth 8 or gray output from a 16-bit
 * color image; SF_ENOMEM. *error has a message (no URL: the caller adds where the bytes came from).
 * Thread-safe.
 */
SF_API int sf_image_decode(const char *format, sf_buffer *buffer, size_t offset, size_t size,
                           sf_image_mode mode, const sf_image_limits *limits, sf_tensor *out, sf_error *error);

/** True (non-zero) when format (a field name's last extension, e.g. "jpg") names an image sf_image_decode decodes. */
SF_API int sf_image_format_known(const char *format);

/**
 * Encodes a uint8 [H, W, C] tensor (C = 1 or 3) as "ppm"/"pgm" (binary), "png" (libspng) or "jpg"
 * (TurboJPEG, quality 1..100). Returns 0 with *out a new buffer (caller owns: sf_buffer_unref), or
 * SF_EINVAL / SF_ENOMEM / SF_EFORMAT with *error set.
 */
SF_API int sf_image_encode(const char *format, const sf_tensor *image, int quality, sf_buffer **out,
                           sf_error *error);

/* ---- NumPy arrays ------------------------------------------------------------------------------ */

/**
 * Reads the .npy file (format 1.0, 2.0 or 3.0) held by buffer at [offset, offset + size) into *out (caller
 * owns; clear it with sf_tensor_clear). dtypes: '|u1'/'<u1' uint8, '<u2' uint16, '<i4' int32, '<i8' int64,
 * '<f4' float32; big-endian, other and structured dtypes and more than SF_TENSOR_MAX_DIMS dimensions are
 * refused. When the first element is aligned to its size, *out is a view of buffer (a new reference, no
 * copy); otherwise the data is copied. A Fortran-order array becomes a view with column-major strides (the
 * shape is numpy's shape). Returns 0; SF_EFORMAT for a corrupt or truncated file; SF_EUNSUPPORTED (the
 * message names the dtype or version); SF_ENOMEM. *out is zeroed on failure; *error has no URL.
 * Spec: numpy.lib.format (NEP 1).
 */
SF_API int sf_npy_read(sf_buffer *buffer, size_t offset, size_t size, sf_tensor *out, sf_error *error);

/**
 * Writes tensor to path as .npy format 1.0 (descriptors '<f4', '|u1', '<u2', '<i8', '<i4', '<f8'; bfloat16 is
 * written as '<u2' raw bits), in logical C order whatever its strides, for numpy.load to read. A debugging aid
 * (device_sink's npy_dir): not for the hot path. Returns 0, SF_EIO or SF_EUNSUPPORTED with *error naming path.
 */
SF_API int sf_npy_write(const char *path, const sf_tensor *tensor, sf_error *error);

/**
 * Called by sf_npz_read once per array, in archive order. name is the member's name without ".npy"
 * (borrowed, valid during the call); the callback takes over *array (transfer full) and leaves it zeroed.
 * Returns 0 to go on, or a negative SF_E code (with *error set) to stop.
 */
typedef int (*sf_npz_array_fn)(void *opaque, const char *name, sf_tensor *array, sf_error *error);

/**
 * Reads the .npz (np.savez, np.savez_compressed) held by buffer at [offset, offset + size): each member
 * NAME.npy (stored or deflated; CRC checked by libzip) is inflated into a new buffer of at most max_member
 * bytes and read with sf_npy_read (its array is a view of that buffer), then passed to fn with opaque.
 * Members not named *.npy are refused. Returns 0; SF_EFORMAT for a corrupt zip or .npy member (the message
 * names the member); SF_ETOOBIG for a member over max_member; SF_EUNSUPPORTED as sf_npy_read; SF_ENOMEM; or
 * what fn returned. Spec: numpy.lib.format, PKWARE APPNOTE (zip).
 */
SF_API int sf_npz_read(sf_buffer *buffer, size_t offset, size_t size, size_t max_member, sf_npz_array_fn fn,
                       void *opaque, sf_error *error);

/* ---- JPEGs left undecoded until the crop is known ---------------------------------------------- */

/**
 * Leaves the JPEG in field f (encoded bytes, uint8 [n]) undecoded when only part of it may be needed: f
 * becomes a deferred uint8 [height, width, channels] field (sf_field) whose tensor header says what
 * sf_image_decode would give, and whose recipe holds the bytes. An sf_image_transform_apply() then decodes
 * only the region its crop reads; any other consumer gets the whole image (sf_field_materialize). Applies
 * to a baseline (not progressive) 8-bit gray or YCbCr/RGB JPEG, mode rgb or gray, limits NULL or with
 * depth 8 (exactly) and min_size 0, within max_pixels. Returns 1 when deferred, 0 when not (f untouched: decode
 * it with sf_image_decode; a corrupt header is left for that to report), or SF_ENOMEM.
 */
SF_API int sf_image_defer_jpeg(sf_field *f, sf_image_mode mode, const sf_image_limits *limits);

/** True when f holds a JPEG left undecoded by sf_image_defer_jpeg(). */
SF_API bool sf_image_is_deferred_jpeg(const sf_field *f);

/**
 * Decodes a JPEG left undecoded in f now, whole, with sf_image_decode's pixels, so that a corrupt one is
 * the caller's error (rather than black pixels and a log line when the engine writes it later). f becomes
 * an ordinary uint8 [H, W, C] field. Other fields: untouched, 0. Returns 0, SF_ENOMEM, or SF_EFORMAT with
 * libjpeg's message in *error (f then unchanged).
 */
SF_API int sf_image_decode_deferred(sf_field *f, sf_error *error);

/**
 * The smallest DCT scale m/8 (m = 1, 2, 4 or 8) at which a JPEG extent of h x w pixels keeps at least
 * min_h x min_w pixels (floor(h*m/8) >= min_h and the same for w); 8 when none smaller does. Decoding at
 * scale m/8 (sf_image_transform's m) costs far less CPU on a large photo cropped to a small output.
 */
SF_API int sf_jpeg_dct_scale(int64_t h, int64_t w, int64_t min_h, int64_t min_w);

/** Pixels of a v-pixel side of a JPEG decoded at scale m/8: ceil(v*m/8), as libjpeg computes it. */
SF_API int64_t sf_jpeg_scaled(int64_t v, int m);

/* ---- the image transform ----------------------------------------------------------------------- */

/** Most channels an image may have for sf_image_transform; decoded images have 1, 3 or 4. */
#define SF_IMAGE_MAX_CHANNELS 16
/** Most channels normalisation tables (sf_image_tables_new) hold a mean and std for. */
#define SF_IMAGE_MAX_NORM_CHANNELS 8

/** Output layout of sf_image_transform. */
typedef enum sf_image_layout {
  SF_IMAGE_HWC = 0, /**< [height, width, channels] */
  SF_IMAGE_CHW = 1, /**< [channels, height, width] */
} sf_image_layout;

/**
 * One axis (rows or columns) of a transform, in source pixels: the source span [origin, origin+span) is
 * resampled to `scaled` pixels (PIL's antialiased bilinear, as Image.resize(BILINEAR) and torchvision's
 * Resize and RandomResizedCrop), and the window [pos, pos+n) of that is the output; window pixels outside
 * [0, scaled) are padding (the value of a zero byte). When scaled == span the axis is a plain copy, no
 * resampling. Requires span >= 1, scaled >= 1, n >= 1, 0 <= origin and origin+span <= the source's extent.
 * E.g. a centre crop of 224 from 256 rows: {0, 256, 256, 16, 224}; a resize of 500 rows to 256:
 * {0, 500, 256, 0, 256}; a random resized crop's box of rows [40, 340) to 224: {40, 300, 224, 0, 224}.
 */
typedef struct sf_image_axis {
  int64_t origin, span, scaled, pos, n;
} sf_image_axis;

/**
 * The source pixels [*first, *end) along axis a that a transform reads for its output window (padding
 * reads nothing, but an axis all padding reads one pixel): what to decode of a JPEG when only that is
 * needed (sf_image_transform's rect). Requirements on a as sf_image_axis.
 */
SF_API void sf_image_axis_reads(const sf_image_axis *a, int64_t *first, int64_t *end);

/**
 * Makes the value tables of a transform's output (*out: a new sf_buffer, caller owns: sf_buffer_unref; its
 * contents are private): byte x becomes x/255 for float32 and bfloat16 outputs, then (x/255 - mean[c]) /
 * std[c] for channel c when n > 0, computed in double and rounded once (bfloat16: the float32 rounded to
 * nearest even); uint8 outputs keep the byte. n is 0 (no mean/std: mean and std may be NULL) or the number
 * of channels, 1..SF_IMAGE_MAX_NORM_CHANNELS. Immutable once made: share one among threads and transforms.
 * Returns 0, SF_EINVAL (n out of range, a NULL array with n > 0, a std not > 0), SF_ENOMEM.
 */
SF_API int sf_image_tables_new(const double *mean, const double *std, int n, sf_buffer **out);

/**
 * The 256 output values of bytes 0..255 in tables (sf_image_tables_new's) for one channel and output dtype, for a
 * kernel of the caller's own (a GPU normalising uint8 batches): uint8_t[256] for SF_DTYPE_UINT8 (the byte kept),
 * float[256] for SF_DTYPE_FLOAT32, uint16_t[256] (bfloat16 bits) for SF_DTYPE_BFLOAT16. Tables without a mean and
 * std have one table for every channel (any channel >= 0 gives it). Borrowed: valid while tables is. NULL for
 * another dtype, a channel out of range, or a buffer sf_image_tables_new did not make.
 */
SF_API const void *sf_image_tables_values(const sf_buffer *tables, sf_dtype dtype, int channel);

/**
 * A transform of one uint8 [H, W, C] image as data: the crop, resize, flip, normalisation, dtype and layout
 * of augment in one pass over the output, whose shape is sf_image_transform_shape's. Axes y (rows) and x
 * (columns) say where every output pixel comes from (sf_image_axis); flip mirrors the output's columns
 * (the window, after resampling). A zeroed struct is not valid: fill every field the source needs. The
 * struct's layout is part of the stage ABI: a change to it bumps SF_STAGE_ABI_VERSION (stage.h).
 */
typedef struct sf_image_transform {
  sf_image_axis y, x;
  bool flip;             /**< mirror the output horizontally */
  sf_buffer *tables;     /**< borrowed: the output values (sf_image_tables_new); when they have a mean and std,
                              channels must equal their count */
  sf_dtype dtype;        /**< output dtype: SF_DTYPE_UINT8, SF_DTYPE_FLOAT32 or SF_DTYPE_BFLOAT16 */
  sf_image_layout layout;
  int channels;          /**< C of the source and the output: 1..SF_IMAGE_MAX_CHANNELS */
  /* A JPEG source only (a field of sf_image_defer_jpeg's given to sf_image_transform_apply); else unused. */
  int m;                 /**< decode at DCT scale m/8 (1, 2, 4 or 8; sf_jpeg_dct_scale): the axes are then in the
                              pixels of the image at that scale (sf_jpeg_scaled of its height and width) */
  int64_t rect[4];       /**< the rows [rect[0], rect[2]) and columns [rect[1], rect[3]) of that image to decode:
                              must hold what the axes read (sf_image_axis_reads) */
  bool fast;             /**< libjpeg's fast integer IDCT (chroma upsampling stays fancy): less CPU, pixels a
                              few levels off; false: sf_image_decode's pixels exactly (at m = 8) */
} sf_image_transform;

/** The output shape of t: [y.n, x.n, channels] (SF_IMAGE_HWC) or [channels, y.n, x.n] (SF_IMAGE_CHW). */
SF_API void sf_image_transform_shape(const sf_image_transform *t, int64_t shape[3]);

/**
 * Writes t's output from the uint8 [H, W, C] image src (any strides; borrowed for the call) into dst, the
 * caller's memory of sf_image_transform_shape's shape, C-contiguous, of t->dtype (a tensor's data, a batch
 * row, a frame of a clip). Resampling axes are resampled first into scratch. Thread-safe (t, src and the
 * tables are only read). Returns 0; SF_EINVAL when t does not fit src (dtype, channels, an axis outside the
 * image; dst untouched); SF_ENOMEM (dst then zeros).
 */
SF_API int sf_image_transform_write(const sf_image_transform *t, const sf_tensor *src, void *dst,
                                    sf_error *error);

/**
 * Applies t to field f, whose values it replaces (dtype t->dtype, shape sf_image_transform_shape's). The
 * source is src when given (a uint8 [H, W, C] image, e.g. an sf_image_resize of f's; the call takes its own
 * references), else f itself: a JPEG left undecoded (sf_image_defer_jpeg; only t->rect is decoded, at
 * scale t->m) or an ordinary uint8 [H, W, C] field. A field deferred any other way must be materialised
 * first (sf_field_materialize). The JPEG region is decoded and any resampling done now, so that a corrupt
 * JPEG is the caller's error; the last pass (crop, flip, values, layout) is usually left deferred: f
 * becomes a deferred field that the engine writes straight into its destination (a batch row), unless the
 * source it would keep alive is much larger than the output, when f gets its output tensor now. Returns 0,
 * SF_EINVAL (t does not fit the source; message in *error), SF_ENOMEM, or SF_EFORMAT for a corrupt JPEG with
 * libjpeg's message in *error; f is unchanged on error.
 */
SF_API int sf_image_transform_apply(sf_field *f, const sf_image_transform *t, const sf_tensor *src,
                                    sf_error *error);

/**
 * sf_image_transform_apply, with the output written now into `into`: a C-contiguous tensor of exactly the
 * output's shape and dtype (a row its consumer lent, sf_node_borrow_row in stage.h), which becomes f's
 * tensor. Nothing is left deferred: the whole transform runs on the caller's thread, its output going
 * straight to where the consumer stacks it. The call takes over the caller's reference to into (cleared on
 * error, *into zeroed on success). Returns as sf_image_transform_apply; SF_EINVAL also when into does not
 * fit; f is unchanged on error.
 */
SF_API int sf_image_transform_apply_into(sf_field *f, const sf_image_transform *t, const sf_tensor *src,
                                         sf_tensor *into, sf_error *error);

/**
 * Resamples all of the uint8 [H, W, C] image src (any strides, C <= SF_IMAGE_MAX_CHANNELS) to h x w pixels
 * with PIL's antialiased bilinear (Image.resize(BILINEAR), bit for bit for 1 and 3 channels) into *out, a
 * new contiguous uint8 [h, w, C] tensor the caller owns (sf_tensor_clear). Returns 0, SF_EINVAL (not such
 * an image, or h or w < 1), SF_ENOMEM.
 */
SF_API int sf_image_resize(const sf_tensor *src, int64_t h, int64_t w, sf_tensor *out);

/* ---- deferred fields ---------------------------------------------------------------------------- */

/**
 * Writes field f's values C-contiguous into dst (sf_tensor_nbytes(&f->tensor) bytes, the caller's): its
 * recipe when deferred (a transform computed straight into dst), else a copy of its tensor (strided or
 * not). f is unchanged. How batch rows get their values without a per-sample allocation.
 */
SF_API void sf_field_write(const sf_field *f, void *dst);

/**
 * Prefetch hints for a stage that holds a sample until a recipe's write (shuffle): where the description of
 * f's engine-made recipe lies (its first byte, and in *size how many), or NULL with *size 0 for any other
 * field. Only an address to prefetch: its contents are private.
 */
SF_API const void *sf_field_recipe_data(const sf_field *f, size_t *size);

/**
 * As sf_field_recipe_data, for the source bytes the recipe of f (an engine-made transform) will read: its
 * first byte, and in *size how many from there; NULL (*size 0) otherwise.
 */
SF_API const void *sf_field_source(const sf_field *f, size_t *size);

#ifdef __cplusplus
}
#endif
#endif
