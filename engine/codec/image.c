/* Image codecs: JPEG (TurboJPEG), PNG (libspng), WebP (libwebp), TIFF (libtiff), GIF (giflib), JPEG 2000 (openjpeg),
   AVIF (libavif with dav1d), JPEG XL (libjxl)
   and binary PPM/PGM to uint8 [H,W,C] tensors and
   back (encoding: JPEG, PNG, PPM/PGM). */
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <avif/avif.h>
#include <gif_lib.h>
#include <jxl/decode.h>
#include <openjpeg.h>
#include <spng.h>
#include <tiffio.h>
#include <turbojpeg.h>
#include <webp/decode.h>

#include "dynlib.h"
#include "image.h"
#include "pixels.h"

#define DEFAULT_MAX_PIXELS 100000000
#define DEFAULT_MAX_SCANS 500
/* TJFLAG_LIMITSCANS (libjpeg-turbo >= 2.1) stops at a fixed 500 scans; our own scan count enforces
   max_scans either way, so an older TurboJPEG without the flag loses only the second guard. */
#ifndef TJFLAG_LIMITSCANS
#define TJFLAG_LIMITSCANS 0
#endif
#define TURBOJPEG_SCAN_LIMIT 500
/* Ancillary PNG chunks (text, ICC, EXIF) are metadata we never use: cap what libspng may hold. */
#define PNG_CHUNK_LIMIT ((size_t)64 << 20)
#define PNG_CACHE_LIMIT ((size_t)64 << 20)

static const uint8_t png_signature[8] = {137, 80, 78, 71, 13, 10, 26, 10};

static int64_t max_pixels_of(const sf_image_limits *limits) {
  return limits && limits->max_pixels > 0 ? limits->max_pixels : DEFAULT_MAX_PIXELS;
}

static int check_pixels(int64_t width, int64_t height, const sf_image_limits *limits,
                        const char *what, sf_error *error) {
  int64_t max = max_pixels_of(limits);
  if (width <= 0 || height <= 0)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "%s has no pixels (%lldx%lld)", what, (long long)width,
                        (long long)height);
  if (width > max || height > max / width)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE,
                        "%s is %lldx%lld pixels, over max_pixels %lld; raise max_pixels if it is genuine", what,
                        (long long)width, (long long)height, (long long)max);
  return 0;
}

/* ITU-R 601-2 luma in Pillow's 16-bit fixed point (Convert.c L24), so gray output matches convert('L'). */
static inline uint8_t luma(const uint8_t *rgb) {
  return (uint8_t)((rgb[0] * 19595u + rgb[1] * 38470u + rgb[2] * 7471u + 0x8000u) >> 16);
}

static void rgb_to_gray(const uint8_t *src, int src_channels, uint8_t *dst, size_t pixels) {
  for (size_t i = 0; i < pixels; i++, src += src_channels) dst[i] = luma(src);
}

static void gray_to_rgb(const uint8_t *src, uint8_t *dst, size_t pixels) {
  for (size_t i = 0; i < pixels; i++, dst += 3) dst[0] = dst[1] = dst[2] = src[i];
}

static int channels_for(sf_image_mode mode, int stored) {
  switch (mode) {
  case SF_IMAGE_RGB: return 3;
  case SF_IMAGE_GRAY: return 1;
  default: return stored;
  }
}

static int alloc_image_of(sf_tensor *out, sf_dtype dtype, int64_t height, int64_t width, int channels,
                          sf_error *error) {
  int r = sf_pixels_alloc(out, dtype, height, width, channels);
  if (r < 0)
    return sf_error_set(error, r, SF_NOWHERE, "cannot allocate a %lldx%lldx%d image", (long long)height,
                        (long long)width, channels);
  return 0;
}

static int alloc_image(sf_tensor *out, int64_t height, int64_t width, int channels, sf_error *error) {
  return alloc_image_of(out, SF_DTYPE_UINT8, height, width, channels, error);
}

static bool wants_16(const sf_image_limits *limits) { return limits && (limits->depth == 16 || limits->depth < 0); }

/* depth 16: an 8-bit result becomes uint16 with v * 257 (0 -> 0, 255 -> 65535), as a 16-bit writer stores it. */
static int widen_to_16(sf_tensor *image, sf_error *error) {
  sf_tensor wide;
  const uint8_t *src = sf_tensor_data(image);
  int r = alloc_image_of(&wide, SF_DTYPE_UINT16, image->shape[0], image->shape[1], (int)image->shape[2], error);
  if (r < 0) return r;
  uint16_t *dst = sf_tensor_data(&wide);
  for (int64_t i = 0, n = sf_tensor_numel(image); i < n; i++)
    dst[i] = (uint16_t)(src[i] * 257u);
  sf_tensor_clear(image);
  *image = wide;
  return 0;
}

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
static void cmyk_to_rgb(const uint8_t *src, uint8_t *dst, size_t pixels) {
  for (size_t i = 0; i < pixels; i++, src += 4, dst += 3) {
    int nk = src[3];
    for (int c = 0; c < 3; c++)
      dst[c] = (uint8_t)(nk - muldiv255(255 - src[c], nk));
  }
}

/* ---- JPEG ---------------------------------------------------------------------------------- */

/* One decompressor per thread: creating one costs more than decoding a small JPEG. */
static pthread_once_t tj_once = PTHREAD_ONCE_INIT;
static pthread_key_t tj_key;
static bool tj_key_ok;

static void tj_handle_free(void *handle) { tjDestroy(handle); }

static void tj_key_create(void) { tj_key_ok = pthread_key_create(&tj_key, tj_handle_free) == 0; }

/* Returns this thread's decompressor; *owned says the caller must destroy it (no TLS key). */
static tjhandle tj_decompressor(bool *owned) {
  pthread_once(&tj_once, tj_key_create);
  *owned = !tj_key_ok;
  if (!tj_key_ok) return tjInitDecompress();
  tjhandle handle = pthread_getspecific(tj_key);
  if (handle) return handle;
  handle = tjInitDecompress();
  if (handle && pthread_setspecific(tj_key, handle) != 0) *owned = true;
  return handle;
}

/*
 * Counts start-of-scan markers by walking the marker segments. Entropy-coded
 * data stuffs every 0xFF with 0x00 (or is followed by a restart marker), so the
 * next 0xFF followed by anything else is the next marker. Stops quietly on
 * malformed input: the decoder reports that.
 */
static int jpeg_scan_count(const uint8_t *p, size_t n) {
  int scans = 0;
  size_t i = 2;
  while (i + 1 < n) {
    if (p[i] != 0xFF || p[i + 1] == 0xFF) {
      i++;
      continue;
    }
    uint8_t marker = p[i + 1];
    i += 2;
    if (marker == 0xD9) break;
    if (marker == 0x00 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    if (i + 2 > n) break;
    size_t length = (size_t)p[i] << 8 | p[i + 1];
    if (length < 2) break;
    i += length;
    if (marker != 0xDA) continue;
    scans++;
    while (i + 1 < n) {
      const uint8_t *ff = memchr(p + i, 0xFF, n - i - 1);
      if (!ff) return scans;
      i = (size_t)(ff - p);
      uint8_t next = p[i + 1];
      if (next != 0x00 && !(next >= 0xD0 && next <= 0xD7)) break;
      i += 2;
    }
  }
  return scans;
}

/* Smallest DCT scaling factor (<= 1) whose both sides stay >= min_size; 1/1 when none is smaller. */
static void jpeg_scaled_size(int width, int height, int min_size, int *out_w, int *out_h) {
  tjscalingfactor best = {1, 1};
  int count = 0;
  tjscalingfactor *factors = min_size > 0 ? tjGetScalingFactors(&count) : NULL;
  for (int i = 0; factors && i < count; i++) {
    tjscalingfactor f = factors[i];
    if (f.num <= 0 || f.denom <= 0 || f.num > f.denom) continue;
    if (TJSCALED(width, f) < min_size || TJSCALED(height, f) < min_size) continue;
    if ((int64_t)f.num * best.denom < (int64_t)best.num * f.denom) best = f;
  }
  *out_w = TJSCALED(width, best);
  *out_h = TJSCALED(height, best);
}

/*
 * True when the decoder's warning is slack before the end-of-image marker ("Corrupt JPEG data: 2
 * extraneous bytes before marker 0xd9", common in ImageNet: the encoder padded its last scan). Seen
 * as the first warning (decoding stopped there), it says every scan was read from intact data and
 * nothing follows, so decoding on gives the whole image, as PIL does. Slack anywhere else may be
 * followed by lost data that TurboJPEG would not report (it keeps one message), so it stays corrupt.
 */
static bool slack_before_eoi(tjhandle tj) {
  return tjGetErrorCode(tj) == TJERR_WARNING &&
         strstr(tjGetErrorStr2(tj), "extraneous bytes before marker 0xd9") != NULL;
}

static int decode_jpeg(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                       sf_tensor *out, sf_error *error) {
  bool owned;
  tjhandle tj = tj_decompressor(&owned);
  if (!tj) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot create a TurboJPEG decompressor");
  int width = 0, height = 0, subsamp, colorspace, r;
  uint8_t *cmyk_pixels = NULL;
  if (tjDecompressHeader3(tj, p, (unsigned long)n, &width, &height, &subsamp, &colorspace) != 0) {
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt JPEG header: %s", tjGetErrorStr2(tj));
    goto done;
  }
  if ((r = check_pixels(width, height, limits, "JPEG", error)) < 0) goto done;
  bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  int max_scans = limits && limits->max_scans > 0 ? limits->max_scans : DEFAULT_MAX_SCANS;
  int scans = jpeg_scan_count(p, n);
  if (scans > max_scans) {
    r = sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "JPEG has %d scans, over max_scans %d", scans, max_scans);
    goto done;
  }
  int stored = colorspace == TJCS_GRAY ? 1 : 3;
  int channels = channels_for(mode, stored);
  int scaled_w, scaled_h;
  jpeg_scaled_size(width, height, limits ? limits->min_size : 0, &scaled_w, &scaled_h);
  if ((r = alloc_image(out, scaled_h, scaled_w, channels, error)) < 0) goto done;
  /* Stop at the first warning: most (truncated data, a bad Huffman code) leave part of the image grey. */
  int flags = max_scans <= TURBOJPEG_SCAN_LIMIT ? TJFLAG_LIMITSCANS : 0;
  int format = cmyk ? TJPF_CMYK : channels == 1 ? TJPF_GRAY : TJPF_RGB;
  uint8_t *pixels = sf_tensor_data(out);
  if (cmyk && !(pixels = cmyk_pixels = malloc((size_t)scaled_w * (size_t)scaled_h * 4))) {
    r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate a %dx%d CMYK image", scaled_w, scaled_h);
    sf_tensor_clear(out);
    goto done;
  }
  if (tjDecompress2(tj, p, (unsigned long)n, pixels, scaled_w, 0, scaled_h, format,
                    flags | TJFLAG_STOPONWARNING) != 0 &&
      !(slack_before_eoi(tj) &&
        (tjDecompress2(tj, p, (unsigned long)n, pixels, scaled_w, 0, scaled_h, format, flags) == 0 ||
         slack_before_eoi(tj)))) {
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt JPEG: %s", tjGetErrorStr2(tj));
    sf_tensor_clear(out);
    goto done;
  }
  if (cmyk) {
    size_t count = (size_t)scaled_w * (size_t)scaled_h;
    if (channels == 3) {
      cmyk_to_rgb(cmyk_pixels, sf_tensor_data(out), count);
    } else {
      /* gray: Pillow's convert('L') of the RGB it would have made. */
      uint8_t rgb[3];
      for (size_t i = 0; i < count; i++) {
        cmyk_to_rgb(cmyk_pixels + 4 * i, rgb, 1);
        ((uint8_t *)sf_tensor_data(out))[i] = luma(rgb);
      }
    }
  }
  r = 0;
done:
  free(cmyk_pixels);
  /* libjpeg-turbo 2.1's tjDecompressHeader3 leaves the handle mid-header after an error (the next
     header then "succeeds" without setting the size): never reuse a handle that failed. */
  if (r < 0 && !owned) pthread_setspecific(tj_key, NULL);
  if (owned || r < 0) tjDestroy(tj);
  return r;
}

/* ---- PNG ----------------------------------------------------------------------------------- */

static int spng_code(int err) {
  switch (err) {
  case SPNG_EMEM: return SF_ENOMEM;
  case SPNG_EUSER_WIDTH:
  case SPNG_EUSER_HEIGHT:
  case SPNG_ECHUNK_LIMITS: return SF_ETOOBIG;
  default: return SF_EFORMAT;
  }
}

/*
 * A 16-bit PNG as uint16 [H, W, C], host-endian: gray without tRNS as stored (1 channel, or
 * repeated to 3 for rgb); everything else through libspng's RGBA16 (tRNS applied), keeping 3
 * channels (rgb, or keep without alpha) or 4 (keep with alpha). Gray output from color is refused:
 * Pillow has no 16-bit luma to match.
 */
static int decode_png16(spng_ctx *ctx, const struct spng_ihdr *ihdr, bool trns, sf_image_mode mode, sf_tensor *out,
                        sf_error *error) {
  bool gray = ihdr->color_type == SPNG_COLOR_TYPE_GRAYSCALE && !trns;
  bool alpha = !gray && (ihdr->color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA ||
                         ihdr->color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA || trns);
  int channels = channels_for(mode, gray ? 1 : alpha ? 4 : 3);
  if (!gray && channels == 1)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "a 16-bit color PNG cannot be decoded to gray at depth 16; use mode rgb or keep");
  int fmt = gray ? SPNG_FMT_PNG : SPNG_FMT_RGBA16;
  size_t pixels = (size_t)ihdr->width * ihdr->height, len;
  int r = spng_decoded_image_size(ctx, fmt, &len);
  if (r) return sf_error_set(error, spng_code(r), SF_NOWHERE, "PNG: %s", spng_strerror(r));
  int stored = gray ? 1 : 4;
  if (len != pixels * (size_t)stored * 2)
    return sf_error_set(error, SF_EINTERNAL, SF_NOWHERE, "PNG decoded size %zu does not match %ux%ux%d", len,
                        ihdr->width, ihdr->height, stored);
  uint16_t *raw = malloc(len);
  if (!raw) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate %zu bytes for a PNG", len);
  if ((r = spng_decode_image(ctx, raw, len, fmt, trns ? SPNG_DECODE_TRNS : 0)) != 0 ||
      (r = spng_decode_chunks(ctx)) != 0) {
    r = sf_error_set(error, spng_code(r), SF_NOWHERE, "corrupt PNG: %s", spng_strerror(r));
  } else if ((r = alloc_image_of(out, SF_DTYPE_UINT16, ihdr->height, ihdr->width, channels, error)) == 0) {
    uint16_t *dst = sf_tensor_data(out);
    for (size_t i = 0; i < pixels; i++)
      for (int c = 0; c < channels; c++)
        dst[i * (size_t)channels + (size_t)c] = raw[i * (size_t)stored + (gray ? 0 : (size_t)c)];
  }
  free(raw);
  return r;
}

static int decode_png(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                      sf_tensor *out, sf_error *error) {
  spng_ctx *ctx = spng_ctx_new(0);
  if (!ctx) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot create a PNG decoder");
  uint8_t *rgb = NULL;
  int64_t max = max_pixels_of(limits);
  uint32_t dim_limit = max < INT32_MAX ? (uint32_t)max : INT32_MAX;
  struct spng_ihdr ihdr;
  struct spng_trns trns;
  int r = spng_set_image_limits(ctx, dim_limit, dim_limit);
  if (!r) r = spng_set_chunk_limits(ctx, PNG_CHUNK_LIMIT, PNG_CACHE_LIMIT);
  if (!r) r = spng_set_png_buffer(ctx, p, n);
  if (!r) r = spng_get_ihdr(ctx, &ihdr);
  if (r) {
    r = sf_error_set(error, spng_code(r), SF_NOWHERE, "corrupt PNG header: %s", spng_strerror(r));
    goto done;
  }
  if ((r = check_pixels(ihdr.width, ihdr.height, limits, "PNG", error)) < 0) goto done;
  bool gray = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE;
  int trns_r = spng_get_trns(ctx, &trns);
  if (trns_r && trns_r != SPNG_ECHUNKAVAIL) {
    r = sf_error_set(error, spng_code(trns_r), SF_NOWHERE, "corrupt PNG: %s", spng_strerror(trns_r));
    goto done;
  }
  if (ihdr.bit_depth == 16 && wants_16(limits)) {
    r = decode_png16(ctx, &ihdr, trns_r == 0, mode, out, error);
    goto done;
  }
  if (gray && ihdr.bit_depth == 16) {
    /* Pillow opens these as 32-bit "I" and clips to 255 when converting: nothing sensible to match. */
    r = sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                     "16-bit grayscale PNG needs decode's depth 16 or native (depth 8 makes 8-bit images)");
    goto done;
  }
  bool alpha = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA ||
               ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR_ALPHA || trns_r == 0;
  int channels = channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  /* libspng converts 16-bit samples by taking the high byte, as Pillow's RGB;16B unpackers do. */
  int fmt = channels == 4 ? SPNG_FMT_RGBA8 : (channels == 1 && gray) ? SPNG_FMT_G8 : SPNG_FMT_RGB8;
  int flags = fmt == SPNG_FMT_RGBA8 ? SPNG_DECODE_TRNS : 0;
  size_t pixels = (size_t)ihdr.width * ihdr.height, len;
  if ((r = spng_decoded_image_size(ctx, fmt, &len)) != 0) {
    r = sf_error_set(error, spng_code(r), SF_NOWHERE, "PNG: %s", spng_strerror(r));
    goto done;
  }
  if ((r = alloc_image(out, ihdr.height, ihdr.width, channels, error)) < 0) goto done;
  uint8_t *dst = sf_tensor_data(out);
  if (channels == 1 && !gray) {
    /* Color to gray: decode RGB, then Pillow's luma, as convert('L') would. */
    rgb = malloc(len);
    if (!rgb) {
      r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate %zu bytes for a PNG", len);
      goto done;
    }
    dst = rgb;
  }
  if (len != pixels * (size_t)(dst == rgb ? 3 : channels)) {
    r = sf_error_set(error, SF_EINTERNAL, SF_NOWHERE, "PNG decoded size %zu does not match %ux%ux%d", len, ihdr.width,
                     ihdr.height, channels);
    goto done;
  }
  /* decode_chunks reads on to IEND: the last IDAT's CRC is only checked there. */
  if ((r = spng_decode_image(ctx, dst, len, fmt, flags)) != 0 || (r = spng_decode_chunks(ctx)) != 0) {
    r = sf_error_set(error, spng_code(r), SF_NOWHERE, "corrupt PNG: %s", spng_strerror(r));
    goto done;
  }
  if (rgb) rgb_to_gray(rgb, 3, sf_tensor_data(out), pixels);
  r = 0;
done:
  if (r < 0) sf_tensor_clear(out);
  free(rgb);
  spng_ctx_free(ctx);
  return r;
}

/* ---- WebP ---------------------------------------------------------------------------------- */

static bool is_webp(const uint8_t *p, size_t n) {
  return n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0;
}

/*
 * A still WebP (lossy or lossless) through libwebp's simple decoder, RGB or RGBA as the mode asks:
 * the first frame's pixels as Pillow reads them (its WebPAnimDecoder decodes a key frame straight into
 * a cleared canvas, non-premultiplied). Gray is Pillow's luma of the RGB. Animated files are refused.
 */
static int decode_webp(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                       sf_tensor *out, sf_error *error) {
  WebPBitstreamFeatures features;
  VP8StatusCode status = WebPGetFeatures(p, n, &features);
  if (status != VP8_STATUS_OK)
    return sf_error_set(error, status == VP8_STATUS_OUT_OF_MEMORY ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                        "corrupt WebP header (libwebp status %d)", (int)status);
  if (features.has_animation)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, "animated WebP is not supported (still images only)");
  int r = check_pixels(features.width, features.height, limits, "WebP", error);
  if (r < 0) return r;
  int channels = channels_for(mode, features.has_alpha ? 4 : 3);
  int decoded = channels == 1 ? 3 : channels;
  size_t pixels = (size_t)features.width * (size_t)features.height;
  uint8_t *rgb = NULL;
  if ((r = alloc_image(out, features.height, features.width, channels, error)) < 0) return r;
  uint8_t *dst = sf_tensor_data(out);
  if (channels == 1 && !(dst = rgb = malloc(pixels * 3))) {
    sf_tensor_clear(out);
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate %zu bytes for a WebP", pixels * 3);
  }
  size_t stride = (size_t)features.width * (size_t)decoded;
  uint8_t *done = decoded == 4 ? WebPDecodeRGBAInto(p, n, dst, pixels * 4, (int)stride)
                               : WebPDecodeRGBInto(p, n, dst, pixels * 3, (int)stride);
  if (!done) {
    free(rgb);
    sf_tensor_clear(out);
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt or truncated WebP");
  }
  if (rgb) rgb_to_gray(rgb, 3, sf_tensor_data(out), pixels);
  free(rgb);
  return 0;
}

/* ---- TIFF ---------------------------------------------------------------------------------- */

/* Largest single allocation libtiff may make (strip, tile, tag arrays): a damaged header cannot ask for more. */
#define TIFF_ALLOC_LIMIT ((tmsize_t)256 << 20)

/* The encoded bytes libtiff reads through its client I/O, and its first error message. */
typedef struct tiff_source {
  const uint8_t *data;
  size_t size, pos;
  char message[160];
} tiff_source;

static tmsize_t tiff_read(thandle_t h, void *buf, tmsize_t n) {
  tiff_source *s = h;
  size_t left = s->pos < s->size ? s->size - s->pos : 0, take = n < 0 ? 0 : (size_t)n;
  if (take > left) take = left;
  memcpy(buf, s->data + s->pos, take);
  s->pos += take;
  return (tmsize_t)take;
}

static tmsize_t tiff_write(thandle_t h, void *buf, tmsize_t n) { return -1; }

static toff_t tiff_seek(thandle_t h, toff_t off, int whence) {
  tiff_source *s = h;
  uint64_t base = whence == SEEK_CUR ? s->pos : whence == SEEK_END ? s->size : 0;
  if (off > UINT64_MAX - base) return (toff_t)-1;
  s->pos = base + off > s->size ? s->size : (size_t)(base + off);
  return base + off;
}

static int tiff_close(thandle_t h) { return 0; }

static toff_t tiff_size(thandle_t h) { return ((tiff_source *)h)->size; }

static int tiff_map(thandle_t h, void **base, toff_t *size) {
  tiff_source *s = h;
  *base = (void *)s->data;
  *size = s->size;
  return 1;
}

static void tiff_unmap(thandle_t h, void *base, toff_t size) {}

/* Keeps the first error for our message instead of libtiff's default of printing to stderr. */
static int tiff_error(TIFF *tif, void *user, const char *module, const char *fmt, va_list ap) {
  tiff_source *s = user;
  if (!s->message[0]) vsnprintf(s->message, sizeof s->message, fmt, ap);
  return 1;
}

static int tiff_warning(TIFF *tif, void *user, const char *module, const char *fmt, va_list ap) { return 1; }

/*
 * Reads the image's samples as stored (contiguous planes; `bytes` per sample) into dst, packed rows of
 * width * spp samples, from strips by scanline or from tiles. Returns 0 or -1 (libtiff said why).
 */
static int tiff_read_samples(TIFF *tif, uint32_t width, uint32_t height, int spp, int bytes, uint8_t *dst) {
  size_t row = (size_t)width * (size_t)spp * (size_t)bytes;
  if (!TIFFIsTiled(tif)) {
    if ((size_t)TIFFScanlineSize64(tif) != row) return -1;
    for (uint32_t y = 0; y < height; y++)
      if (TIFFReadScanline(tif, dst + y * row, y, 0) < 0) return -1;
    return 0;
  }
  uint32_t tw = 0, th = 0;
  if (!TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tw) || !TIFFGetField(tif, TIFFTAG_TILELENGTH, &th) || !tw || !th)
    return -1;
  tmsize_t tile_size = TIFFTileSize(tif);
  size_t tile_row = (size_t)tw * (size_t)spp * (size_t)bytes;
  if (tile_size <= 0 || (uint64_t)tile_size != (uint64_t)tile_row * th) return -1;
  uint8_t *tile = _TIFFmalloc(tile_size);
  if (!tile) return -1;
  int r = 0;
  for (uint32_t y0 = 0; y0 < height && r == 0; y0 += th)
    for (uint32_t x0 = 0; x0 < width && r == 0; x0 += tw) {
      if (TIFFReadTile(tif, tile, x0, y0, 0, 0) < 0) {
        r = -1;
        break;
      }
      uint32_t cw = width - x0 < tw ? width - x0 : tw, ch = height - y0 < th ? height - y0 : th;
      for (uint32_t y = 0; y < ch; y++)
        memcpy(dst + (size_t)(y0 + y) * row + (size_t)x0 * (size_t)spp * (size_t)bytes, tile + (size_t)y * tile_row,
               (size_t)cw * (size_t)spp * (size_t)bytes);
    }
  _TIFFfree(tile);
  return r;
}

/* 8-bit CMYK to RGB (or its luma) with Pillow's cmyk2rgb, which libtiff's RGBA reader rounds differently. */
static int decode_tiff_cmyk(TIFF *tif, tiff_source *src, uint32_t width, uint32_t height, sf_image_mode mode,
                            sf_tensor *out, sf_error *error) {
  size_t pixels = (size_t)width * height;
  uint8_t *cmyk = malloc(pixels * 4);
  if (!cmyk) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate a %ux%u CMYK TIFF", width, height);
  int channels = mode == SF_IMAGE_GRAY ? 1 : 3, r;
  if (tiff_read_samples(tif, width, height, 4, 1, cmyk) < 0) {
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt TIFF: %s",
                     src->message[0] ? src->message : "cannot read its samples");
  } else if ((r = alloc_image(out, height, width, channels, error)) == 0) {
    /* cmyk_to_rgb takes Adobe-inverted samples (as JPEG's CMYK comes): invert TIFF's plain ones. */
    uint8_t *dst = sf_tensor_data(out);
    for (size_t i = 0; i < pixels; i++) {
      uint8_t inverted[4], rgb[3];
      for (int c = 0; c < 4; c++) inverted[c] = (uint8_t)(255 - cmyk[i * 4 + c]);
      cmyk_to_rgb(inverted, channels == 3 ? dst + i * 3 : rgb, 1);
      if (channels == 1) dst[i] = luma(rgb);
    }
  }
  free(cmyk);
  return r;
}

/* What decode_tiff reads of the first page's tags before choosing a path. */
typedef struct tiff_info {
  uint32_t width, height;
  uint16_t bits, spp, photometric, planar, format, compression, extra_count, *extra;
} tiff_info;

/*
 * The direct path: 8/16-bit gray or RGB (alpha unassociated) in contiguous samples, read as stored (16-bit
 * kept at depth 16, else its high byte). Returns 0 or fails with out cleared by the caller.
 */
static int decode_tiff_direct(TIFF *tif, const tiff_source *src, const tiff_info *t, sf_image_mode mode,
                              const sf_image_limits *limits, sf_tensor *out, sf_error *error) {
  const int color = t->photometric == PHOTOMETRIC_RGB ? 3 : 1, spp = t->spp, bytes = t->bits / 8;
  const bool alpha = spp == color + 1, gray = color == 1 && !alpha, wide = t->bits == 16 && wants_16(limits);
  const int channels = channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  const size_t pixels = (size_t)t->width * t->height;
  if (t->bits == 16 && color == 1 && !alpha && !wide)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "16-bit grayscale TIFF needs decode's depth 16 or native (depth 8 makes 8-bit images)");
  if (wide && channels == 1 && !gray)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "a 16-bit color TIFF cannot be decoded to gray at depth 16; use mode rgb or keep");
  uint8_t *raw = malloc(pixels * (size_t)spp * (size_t)bytes);
  if (!raw) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate a %ux%u TIFF", t->width, t->height);
  int r;
  if (tiff_read_samples(tif, t->width, t->height, spp, bytes, raw) < 0) {
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt TIFF: %s",
                     src->message[0] ? src->message : "cannot read its samples");
  } else if ((r = alloc_image_of(out, wide ? SF_DTYPE_UINT16 : SF_DTYPE_UINT8, t->height, t->width, channels,
                                 error)) == 0) {
    /* Source sample k of pixel i for output channel c: gray repeats its one sample, alpha is the last. */
    for (size_t i = 0; i < pixels; i++) {
      const uint8_t *px = raw + i * (size_t)spp * (size_t)bytes;
      uint32_t v[4];
      for (int c = 0; c < 4; c++) {
        int k = c == 3 ? (alpha ? spp - 1 : -1) : color == 1 ? 0 : c;
        uint32_t sample = k < 0 ? 0 : bytes == 1 ? px[k] : ((const uint16_t *)(const void *)px)[k];
        v[c] = wide || bytes == 1 ? sample : sample >> 8;
      }
      if (channels == 1 && !gray) {
        uint8_t rgb[3] = {(uint8_t)v[0], (uint8_t)v[1], (uint8_t)v[2]};
        v[0] = luma(rgb);
      }
      for (int c = 0; c < channels; c++) {
        if (wide)
          ((uint16_t *)sf_tensor_data(out))[i * channels + c] = (uint16_t)v[c];
        else
          ((uint8_t *)sf_tensor_data(out))[i * channels + c] = (uint8_t)v[c];
      }
    }
  }
  free(raw);
  return r;
}

/* Everything else libtiff's RGBA reader takes (palette, bilevel, YCbCr, other depths), as 8-bit RGBA. */
static int decode_tiff_rgba(TIFF *tif, const tiff_source *src, const tiff_info *t, sf_image_mode mode,
                            sf_tensor *out, sf_error *error) {
  char why[1024] = "";
  if (!TIFFRGBAImageOK(tif, why)) return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, "TIFF not supported: %s", why);
  const bool alpha = t->extra_count >= 1 && (t->photometric == PHOTOMETRIC_RGB || t->photometric == PHOTOMETRIC_MINISBLACK);
  const bool gray = !alpha && (t->photometric == PHOTOMETRIC_MINISBLACK || t->photometric == PHOTOMETRIC_MINISWHITE);
  const int channels = channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  const size_t pixels = (size_t)t->width * t->height;
  uint8_t *raw = malloc(pixels * 4);
  if (!raw) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate a %ux%u TIFF", t->width, t->height);
  int r;
  /* stop on error: a damaged strip is an error, not a gray band. */
  if (!TIFFReadRGBAImageOriented(tif, t->width, t->height, (uint32_t *)(void *)raw, ORIENTATION_TOPLEFT, 1)) {
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt TIFF: %s",
                     src->message[0] ? src->message : "cannot read its pixels");
  } else if ((r = alloc_image(out, t->height, t->width, channels, error)) == 0) {
    uint8_t *dst = sf_tensor_data(out);
    for (size_t i = 0; i < pixels; i++) {
      uint32_t abgr = ((const uint32_t *)(const void *)raw)[i];
      uint8_t rgba[4] = {(uint8_t)TIFFGetR(abgr), (uint8_t)TIFFGetG(abgr), (uint8_t)TIFFGetB(abgr),
                         (uint8_t)TIFFGetA(abgr)};
      if (channels == 1)
        dst[i] = gray ? rgba[0] : luma(rgba);
      else
        memcpy(dst + i * channels, rgba, (size_t)channels);
    }
  }
  free(raw);
  return r;
}

/*
 * The first page of a TIFF as Pillow decodes it. Gray, gray+alpha, RGB and RGBA with 8- or 16-bit
 * unsigned samples in one plane (JPEG-compressed YCbCr read as RGB by libjpeg, as Pillow asks libtiff)
 * are read as stored: 16-bit samples as uint16 at depth 16/native, their high byte at depth 8 (16-bit
 * gray is refused there, as for PNG). Everything else (palette, bilevel, 2/4-bit, CMYK, separate planes)
 * goes through libtiff's RGBA reader, 8-bit; associated (premultiplied) alpha is kept as stored. 8-bit CMYK
 * is converted with Pillow's formula.
 */
static int decode_tiff(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                       sf_tensor *out, sf_error *error) {
  tiff_source src = {.data = p, .size = n};
  TIFFOpenOptions *opts = TIFFOpenOptionsAlloc();
  if (!opts) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot create a TIFF decoder");
  TIFFOpenOptionsSetMaxSingleMemAlloc(opts, TIFF_ALLOC_LIMIT);
  TIFFOpenOptionsSetErrorHandlerExtR(opts, tiff_error, &src);
  TIFFOpenOptionsSetWarningHandlerExtR(opts, tiff_warning, &src);
  TIFF *tif = TIFFClientOpenExt("tiff", "rm", &src, tiff_read, tiff_write, tiff_seek, tiff_close, tiff_size,
                                tiff_map, tiff_unmap, opts);
  TIFFOpenOptionsFree(opts);
  if (!tif)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt TIFF header: %s",
                        src.message[0] ? src.message : "libtiff cannot open it");
  tiff_info t = {.bits = 1, .spp = 1, .planar = PLANARCONFIG_CONTIG, .format = SAMPLEFORMAT_UINT,
                 .compression = COMPRESSION_NONE};
  int r;
  TIFFGetField(tif, TIFFTAG_IMAGEWIDTH, &t.width);
  TIFFGetField(tif, TIFFTAG_IMAGELENGTH, &t.height);
  TIFFGetFieldDefaulted(tif, TIFFTAG_BITSPERSAMPLE, &t.bits);
  TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLESPERPIXEL, &t.spp);
  TIFFGetFieldDefaulted(tif, TIFFTAG_PLANARCONFIG, &t.planar);
  TIFFGetFieldDefaulted(tif, TIFFTAG_SAMPLEFORMAT, &t.format);
  TIFFGetFieldDefaulted(tif, TIFFTAG_COMPRESSION, &t.compression);
  TIFFGetFieldDefaulted(tif, TIFFTAG_EXTRASAMPLES, &t.extra_count, &t.extra);
  if (!TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &t.photometric)) {
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt TIFF: no PhotometricInterpretation");
    goto done;
  }
  if ((r = check_pixels(t.width, t.height, limits, "TIFF", error)) < 0) goto done;
  if (t.photometric == PHOTOMETRIC_YCBCR && t.compression == COMPRESSION_JPEG) {
    TIFFSetField(tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);
    t.photometric = PHOTOMETRIC_RGB;
  }
  uint16_t inkset = INKSET_CMYK;
  TIFFGetFieldDefaulted(tif, TIFFTAG_INKSET, &inkset);
  const int color = t.photometric == PHOTOMETRIC_RGB ? 3 : 1;
  const bool unassociated = t.extra_count == 1 && t.extra && t.extra[0] != EXTRASAMPLE_ASSOCALPHA;
  if (t.photometric == PHOTOMETRIC_SEPARATED && inkset == INKSET_CMYK && t.spp == 4 && t.bits == 8 &&
      t.planar == PLANARCONFIG_CONTIG && t.format == SAMPLEFORMAT_UINT)
    r = decode_tiff_cmyk(tif, &src, t.width, t.height, mode, out, error);
  else if ((t.photometric == PHOTOMETRIC_RGB || t.photometric == PHOTOMETRIC_MINISBLACK) &&
           (t.planar == PLANARCONFIG_CONTIG || t.spp == 1) && t.format == SAMPLEFORMAT_UINT &&
           (t.bits == 8 || t.bits == 16) && (t.spp == color || (t.spp == color + 1 && unassociated)))
    r = decode_tiff_direct(tif, &src, &t, mode, limits, out, error);
  else
    r = decode_tiff_rgba(tif, &src, &t, mode, out, error);
done:
  if (r < 0) sf_tensor_clear(out);
  TIFFClose(tif);
  return r;
}

/* ---- GIF ----------------------------------------------------------------------------------- */

typedef struct gif_source {
  const uint8_t *data;
  size_t size, pos;
} gif_source;

static int gif_read(GifFileType *gif, GifByteType *buf, int n) {
  gif_source *s = gif->UserData;
  size_t left = s->size - s->pos, take = n < 0 ? 0 : (size_t)n;
  if (take > left) take = left;
  memcpy(buf, s->data + s->pos, take);
  s->pos += take;
  return (int)take;
}

/* Pillow's test for a palette that is only the gray ramp 0, 1, 2, ... (such a GIF opens as "L"). */
static bool gif_palette_needed(const ColorMapObject *map) {
  for (int i = 0; map && i < map->ColorCount; i++)
    if (map->Colors[i].Red != i || map->Colors[i].Green != i || map->Colors[i].Blue != i) return true;
  return false;
}

/* The color of index in map as Pillow shows it: indices past the palette's end (and palette-less files) gray. */
static void gif_color(const ColorMapObject *map, int index, uint8_t rgb[3]) {
  if (map && index < map->ColorCount) {
    rgb[0] = map->Colors[index].Red;
    rgb[1] = map->Colors[index].Green;
    rgb[2] = map->Colors[index].Blue;
  } else {
    rgb[0] = rgb[1] = rgb[2] = (uint8_t)index;
  }
}

/* What the records before an image say about it. */
typedef struct gif_frame_info {
  int transparent; /* the transparent index, or -1 */
  int disposal;    /* the graphics control's disposal bits, 0 when none */
} gif_frame_info;

/*
 * Reads records up to the next image descriptor, its graphics control into *info. Returns 1 at an image, 0 at
 * the end of the file, -1 on an error (the caller reports gif->Error).
 */
static int gif_next_image(GifFileType *gif, gif_frame_info *info) {
  info->transparent = -1;
  info->disposal = 0;
  for (;;) {
    GifRecordType type;
    if (DGifGetRecordType(gif, &type) == GIF_ERROR) return -1;
    if (type == TERMINATE_RECORD_TYPE) return 0;
    if (type == EXTENSION_RECORD_TYPE) {
      int ext_code;
      GifByteType *ext;
      if (DGifGetExtension(gif, &ext_code, &ext) == GIF_ERROR) return -1;
      /* Graphics control: byte 1 bit 0 says byte 4 is the transparent index; bits 2-4 are the disposal. */
      if (ext_code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4) {
        info->transparent = (ext[1] & 1) ? ext[4] : -1;
        info->disposal = (ext[1] >> 2) & 7;
      }
      while (ext)
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR) return -1;
      continue;
    }
    if (type != IMAGE_DESC_RECORD_TYPE) continue;
    return DGifGetImageDesc(gif) == GIF_ERROR ? -1 : 1;
  }
}

/* The current image's indices into dst (rows stride bytes apart); interlaced rows come in four passes. 0 or -1. */
static int gif_read_raster(GifFileType *gif, uint8_t *dst, size_t stride) {
  static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
  const GifImageDesc *d = &gif->Image;
  for (int pass = d->Interlace ? 0 : 3; pass < 4; pass++)
    for (int y = d->Interlace ? start[pass] : 0; y < d->Height; y += d->Interlace ? step[pass] : 1)
      if (DGifGetLine(gif, dst + (size_t)y * stride, d->Width) == GIF_ERROR) return -1;
  return 0;
}

static int gif_error(GifFileType *gif, sf_error *error) {
  return sf_error_set(error, gif->Error == D_GIF_ERR_NOT_ENOUGH_MEM ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                      "corrupt GIF: %s", GifErrorString(gif->Error));
}

/*
 * The first frame's index canvas as Pillow 9 makes it: the screen size (grown to the frame if that sticks
 * out) filled with the transparent index, or 0, the frame's indices written into it.  *canvas is newly
 * allocated (the caller frees it).
 */
static int gif_first_canvas(GifFileType *gif, const sf_image_limits *limits, gif_frame_info *info, uint8_t **canvas,
                            int64_t *width, int64_t *height, sf_error *error) {
  int r = gif_next_image(gif, info);
  if (r < 0) return gif_error(gif, error);
  if (r == 0) return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt GIF: no image in it");
  const GifImageDesc *desc = &gif->Image;
  int64_t left = desc->Left, top = desc->Top, fw = desc->Width, fh = desc->Height;
  *width = gif->SWidth > left + fw ? gif->SWidth : left + fw;
  *height = gif->SHeight > top + fh ? gif->SHeight : top + fh;
  if ((r = check_pixels(*width, *height, limits, "GIF", error)) < 0) return r;
  size_t pixels = (size_t)*width * (size_t)*height;
  if (!(*canvas = malloc(pixels)))
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate a %lldx%lld GIF", (long long)*width,
                        (long long)*height);
  memset(*canvas, info->transparent >= 0 ? info->transparent : 0, pixels);
  if (fw > 0 && fh > 0 && gif_read_raster(gif, *canvas + (size_t)top * (size_t)*width + (size_t)left,
                                          (size_t)*width) < 0)
    return gif_error(gif, error);
  return 0;
}

/*
 * The first frame of a GIF as Pillow 9 decodes it: the index canvas of gif_first_canvas through the frame's
 * palette (or the global one; indices past its end and palette-less files are gray, as Pillow's ramp). A
 * transparent index gives RGBA in mode keep.
 */
static int decode_gif(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                      sf_tensor *out, sf_error *error) {
  gif_source src = {.data = p, .size = n};
  int code = 0;
  GifFileType *gif = DGifOpen(&src, gif_read, &code);
  if (!gif) return sf_error_set(error, code == D_GIF_ERR_NOT_ENOUGH_MEM ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                                "corrupt GIF header: %s", GifErrorString(code));
  uint8_t *canvas = NULL;
  int64_t width = 0, height = 0;
  gif_frame_info info;
  int r = gif_first_canvas(gif, limits, &info, &canvas, &width, &height, error);
  const ColorMapObject *map = gif->Image.ColorMap ? gif->Image.ColorMap : gif->SColorMap;
  bool gray = !gif_palette_needed(map), alpha = info.transparent >= 0;
  int channels = channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  if (r == 0) r = alloc_image(out, height, width, channels, error);
  size_t pixels = (size_t)width * (size_t)height;
  uint8_t *dst = r == 0 ? sf_tensor_data(out) : NULL;
  for (size_t i = 0; dst && i < pixels; i++, dst += channels) {
    int index = canvas[i];
    uint8_t rgba[4] = {(uint8_t)index, (uint8_t)index, (uint8_t)index, index == info.transparent ? 0 : 255};
    if (!gray) gif_color(map, index, rgba);
    if (channels == 1)
      dst[0] = gray ? (uint8_t)index : luma(rgba);
    else
      memcpy(dst, rgba, (size_t)channels);
  }
  if (r < 0) sf_tensor_clear(out);
  free(canvas);
  DGifCloseFile(gif, &code);
  return r;
}

/* A rectangle of the canvas: x0 <= x < x1, y0 <= y < y1 (clipped to it). */
typedef struct gif_box {
  int64_t x0, y0, x1, y1;
} gif_box;

static gif_box gif_frame_box(const GifFileType *gif, int64_t width, int64_t height) {
  const GifImageDesc *d = &gif->Image;
  gif_box b = {d->Left, d->Top, (int64_t)d->Left + d->Width, (int64_t)d->Top + d->Height};
  if (b.x1 > width) b.x1 = width;
  if (b.y1 > height) b.y1 = height;
  if (b.x0 > b.x1) b.x0 = b.x1;
  if (b.y0 > b.y1) b.y0 = b.y1;
  return b;
}

/*
 * How the previous frame is disposed of before the next is drawn, as Pillow 9's GifImagePlugin does it: its
 * disposal method (the last nonzero one seen: Pillow keeps it across frames that give none) decides, over the
 * previous frame's box, between nothing, a fill (the frame's transparent index with alpha 0, else the screen's
 * background color) and the canvas as it was before the frame was drawn.
 */
typedef struct gif_dispose {
  int kind;           /* 0 none, 2 fill, 3 restore */
  gif_box box;
  uint8_t fill[4];    /* RGBA; alpha 0 only matters on an RGBA canvas */
  int fill_index;     /* after the first frame: the index to fill its index canvas with */
  uint8_t *saved;     /* kind 3: the box's RGBA pixels before the frame (owned) */
} gif_dispose;

/* A GIF's frames being composed: the canvas (RGBA), the frames so far, the pending disposal. */
typedef struct gif_sequence {
  GifFileType *gif;
  const sf_image_limits *limits;
  int64_t width, height;
  size_t pixels;
  const ColorMapObject *map; /* the first frame's palette; NULL when Pillow reads it as gray ("L") */
  int transparent;           /* the first frame's transparent index, or -1 */
  int channels;              /* of the output */
  int method;                /* Pillow's disposal_method: the last nonzero one */
  uint8_t *rgba, *frame, *frames;
  int64_t count, capacity;
  gif_dispose dispose;
} gif_sequence;

/* Appends the canvas to the frames, in the output's channels. */
static int gif_append(gif_sequence *q, sf_error *error) {
  int64_t max = max_pixels_of(q->limits);
  if (q->count >= max / (int64_t)q->pixels)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE,
                        "GIF of %lldx%lld pixels has more than %lld frames, over max_pixels %lld in all; raise "
                        "max_pixels if it is genuine",
                        (long long)q->width, (long long)q->height, (long long)q->count, (long long)max);
  if (q->count == q->capacity) {
    int64_t capacity = q->capacity ? q->capacity * 2 : 8;
    uint8_t *grown = realloc(q->frames, (size_t)capacity * q->pixels * (size_t)q->channels);
    if (!grown)
      return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory for %lld GIF frames", (long long)capacity);
    q->frames = grown;
    q->capacity = capacity;
  }
  uint8_t *dst = q->frames + (size_t)q->count++ * q->pixels * (size_t)q->channels;
  for (size_t i = 0; i < q->pixels; i++, dst += q->channels) {
    const uint8_t *px = q->rgba + 4 * i;
    if (q->channels == 1) dst[0] = luma(px);
    else memcpy(dst, px, (size_t)q->channels);
  }
  return 0;
}

/* The pending disposal, over the canvas. After the first frame it works on the index canvas (Pillow's "P"). */
static void gif_dispose_apply(gif_sequence *q, bool after_first) {
  const gif_dispose *d = &q->dispose;
  size_t box_width = (size_t)(d->box.x1 - d->box.x0);
  for (int64_t y = d->box.y0; d->kind && y < d->box.y1; y++)
    for (int64_t x = d->box.x0; x < d->box.x1; x++) {
      uint8_t *px = q->rgba + 4 * ((size_t)y * (size_t)q->width + (size_t)x);
      if (after_first) {
        gif_color(q->map, d->fill_index, px);
        px[3] = d->fill_index == q->transparent ? 0 : 255;
      } else if (d->kind == 2) {
        memcpy(px, d->fill, q->transparent >= 0 ? 4 : 3);
      } else {
        memcpy(px, d->saved + 4 * ((size_t)(y - d->box.y0) * box_width + (size_t)(x - d->box.x0)), 4);
      }
    }
}

/* The disposal of the frame about to be drawn (info, map), worked out before it is: a restore saves the canvas. */
static int gif_dispose_plan(gif_sequence *q, const gif_frame_info *info, const ColorMapObject *map, sf_error *error) {
  gif_box box = gif_frame_box(q->gif, q->width, q->height);
  free(q->dispose.saved);
  q->dispose = (gif_dispose){.kind = q->method < 2 ? 0 : q->method == 2 ? 2 : 3, .box = box};
  if (q->dispose.kind == 2) {
    gif_color(map, info->transparent >= 0 ? info->transparent : q->gif->SBackGroundColor, q->dispose.fill);
    q->dispose.fill[3] = info->transparent >= 0 ? 0 : 255;
  } else if (q->dispose.kind == 3) {
    size_t bw = (size_t)(box.x1 - box.x0), bh = (size_t)(box.y1 - box.y0);
    if (!(q->dispose.saved = malloc(bw * bh * 4 + 1)))
      return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory for a GIF frame");
    for (size_t y = 0; y < bh; y++)
      memcpy(q->dispose.saved + y * bw * 4, q->rgba + 4 * (((size_t)box.y0 + y) * (size_t)q->width + (size_t)box.x0),
             bw * 4);
  }
  return 0;
}

/* Reads the current frame's indices and draws them over the canvas, but where they are transparent. */
static int gif_draw(gif_sequence *q, const gif_frame_info *info, const ColorMapObject *map, sf_error *error) {
  const GifImageDesc *d = &q->gif->Image;
  int64_t fw = d->Width, fh = d->Height;
  if (fw <= 0 || fh <= 0) return 0;
  int r = check_pixels(fw, fh, q->limits, "GIF frame", error);
  if (r < 0) return r;
  uint8_t *grown = realloc(q->frame, (size_t)fw * (size_t)fh);
  if (!grown) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory for a GIF frame");
  q->frame = grown;
  if (gif_read_raster(q->gif, q->frame, (size_t)fw) < 0) return gif_error(q->gif, error);
  gif_box box = gif_frame_box(q->gif, q->width, q->height);
  for (int64_t y = box.y0; y < box.y1; y++)
    for (int64_t x = box.x0; x < box.x1; x++) {
      int i = q->frame[(size_t)(y - d->Top) * (size_t)fw + (size_t)(x - d->Left)];
      if (i == info->transparent) continue;
      uint8_t *px = q->rgba + 4 * ((size_t)y * (size_t)q->width + (size_t)x);
      gif_color(map, i, px);
      px[3] = 255;
    }
  return 0;
}

/* The first frame's canvas, palette and disposal; the canvas as RGBA. */
static int gif_sequence_start(gif_sequence *q, sf_image_mode mode, sf_error *error) {
  uint8_t *index = NULL;
  gif_frame_info info;
  int r = gif_first_canvas(q->gif, q->limits, &info, &index, &q->width, &q->height, error);
  const ColorMapObject *map = q->gif->Image.ColorMap ? q->gif->Image.ColorMap : q->gif->SColorMap;
  q->map = gif_palette_needed(map) ? map : NULL;
  q->transparent = info.transparent;
  q->channels = channels_for(mode, info.transparent >= 0 ? 4 : 3);
  q->method = info.disposal;
  q->pixels = (size_t)q->width * (size_t)q->height;
  if (r == 0 && !(q->rgba = malloc(q->pixels * 4)))
    r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory for a %lldx%lld GIF", (long long)q->width,
                     (long long)q->height);
  if (r == 0) {
    /* The first frame's own disposal fills its index canvas: with the transparent index (also for a restore,
     * there being nothing before), else the background's. */
    q->dispose.box = gif_frame_box(q->gif, q->width, q->height);
    q->dispose.kind = q->method == 2 || (q->method >= 3 && info.transparent >= 0) ? 2 : 0;
    q->dispose.fill_index = info.transparent >= 0 ? info.transparent : q->gif->SBackGroundColor;
    for (size_t i = 0; i < q->pixels; i++) {
      gif_color(q->map, index[i], q->rgba + 4 * i);
      q->rgba[4 * i + 3] = index[i] == info.transparent ? 0 : 255;
    }
  }
  free(index);
  return r;
}

/*
 * Every frame of a GIF as Pillow 9 iterates them (ImageSequence, each converted to RGB): the first as
 * decode_gif makes it; then on an RGB canvas (RGBA when the first frame has a transparent index) each frame
 * drawn over the last, its transparent pixels leaving the canvas as it was, after the last frame's disposal.
 * Frames that stick out of the first frame's canvas are clipped to it. A [T, H, W, C] tensor: C 3 for rgb, 1
 * for gray (luma), 4 for keep when the first frame has a transparent index, else 3. A palette-less or gray-ramp
 * GIF (which Pillow opens as "L") is drawn the same way, its indices as gray levels. max_pixels bounds
 * T x H x W.
 */
static int decode_gif_frames(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                             sf_tensor *out, sf_error *error) {
  gif_source src = {.data = p, .size = n};
  int code = 0;
  gif_sequence q = {.gif = DGifOpen(&src, gif_read, &code), .limits = limits};
  if (!q.gif) return sf_error_set(error, code == D_GIF_ERR_NOT_ENOUGH_MEM ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                                  "corrupt GIF header: %s", GifErrorString(code));
  int r = gif_sequence_start(&q, mode, error);
  for (bool first = true; r == 0; first = false) {
    if ((r = gif_append(&q, error)) < 0) break;
    /* The next frame: its records, then the last one's disposal, then its own planned, then its pixels. */
    gif_frame_info info;
    int got = gif_next_image(q.gif, &info);
    if (got < 0) r = gif_error(q.gif, error);
    if (got != 1) break;
    if (info.disposal) q.method = info.disposal;
    const ColorMapObject *map = q.gif->Image.ColorMap ? q.gif->Image.ColorMap : q.gif->SColorMap;
    if (!gif_palette_needed(map)) map = NULL;
    gif_dispose_apply(&q, first);
    if ((r = gif_dispose_plan(&q, &info, map, error)) == 0) r = gif_draw(&q, &info, map, error);
  }
  if (r == 0) {
    const int64_t shape[4] = {q.count, q.height, q.width, q.channels};
    r = sf_tensor_alloc(out, SF_DTYPE_UINT8, 4, shape);
    if (r < 0) r = sf_error_set(error, r, SF_NOWHERE, "cannot allocate %lld GIF frames", (long long)q.count);
    else memcpy(sf_tensor_data(out), q.frames, (size_t)q.count * q.pixels * (size_t)q.channels);
  }
  if (r < 0) sf_tensor_clear(out);
  free(q.dispose.saved);
  free(q.frames);
  free(q.frame);
  free(q.rgba);
  DGifCloseFile(q.gif, &code);
  return r;
}

/* ---- JPEG 2000 ----------------------------------------------------------------------------- */

static const uint8_t jp2_signature[12] = {0, 0, 0, 12, 'j', 'P', ' ', ' ', 13, 10, 0x87, 10};

typedef struct j2k_source {
  const uint8_t *data;
  size_t size, pos;
  char message[160];
} j2k_source;

static OPJ_SIZE_T j2k_read(void *buf, OPJ_SIZE_T n, void *user) {
  j2k_source *s = user;
  size_t left = s->size - s->pos, take = n < left ? n : left;
  if (take == 0) return (OPJ_SIZE_T)-1;
  memcpy(buf, s->data + s->pos, take);
  s->pos += take;
  return take;
}

static OPJ_OFF_T j2k_skip(OPJ_OFF_T n, void *user) {
  j2k_source *s = user;
  if (n < 0) n = (OPJ_OFF_T)s->pos < -n ? -(OPJ_OFF_T)s->pos : n;
  else if ((uint64_t)n > s->size - s->pos) n = (OPJ_OFF_T)(s->size - s->pos);
  s->pos = (size_t)((OPJ_OFF_T)s->pos + n);
  return n;
}

static OPJ_BOOL j2k_seek(OPJ_OFF_T n, void *user) {
  j2k_source *s = user;
  if (n < 0 || (uint64_t)n > s->size) return OPJ_FALSE;
  s->pos = (size_t)n;
  return OPJ_TRUE;
}

static void j2k_error(const char *msg, void *user) {
  j2k_source *s = user;
  if (!s->message[0]) {
    snprintf(s->message, sizeof s->message, "%s", msg);
    size_t len = strlen(s->message);
    if (len && s->message[len - 1] == '\n') s->message[len - 1] = 0;
  }
}

static void j2k_quiet(const char *msg, void *user) {}

/* Whether Pillow's layouts cover image: 1-4 full-size components of one precision up to 16 bits, gray or RGB. */
static bool j2k_supported(const opj_image_t *image) {
  uint32_t count = image->numcomps, prec = count ? image->comps[0].prec : 0;
  bool same = count >= 1 && count <= 4 && prec >= 1 && prec <= 16;
  for (uint32_t c = 0; same && c < count; c++)
    same = image->comps[c].dx == 1 && image->comps[c].dy == 1 && image->comps[c].prec == prec;
  return same && image->color_space != OPJ_CLRSPC_SYCC && image->color_space != OPJ_CLRSPC_CMYK &&
         image->color_space != OPJ_CLRSPC_EYCC;
}

/*
 * The decoded components into out (allocated: `channels` channels, uint16 when wide): signed samples offset
 * by half their range, shifted to 8 (or 16) bits, clamped; gray repeated, alpha the last component.
 */
static void j2k_pixels(const opj_image_t *image, bool wide, int channels, sf_tensor *out) {
  const uint32_t count = image->numcomps, prec = image->comps[0].prec;
  const bool gray = count <= 2, alpha = count == 2 || count == 4;
  int shift = (wide ? 16 : 8) - (int)prec;
  int32_t top = wide ? 65535 : 255;
  size_t pixels = (size_t)image->comps[0].w * image->comps[0].h;
  for (size_t i = 0; i < pixels; i++) {
    int32_t v[4] = {0, 0, 0, 0};
    for (uint32_t c = 0; c < count; c++) {
      int32_t x = image->comps[c].data[i] + (image->comps[c].sgnd ? (int32_t)1 << (prec - 1) : 0);
      x = shift < 0 ? x >> -shift : x << shift;
      v[c] = x < 0 ? 0 : x > top ? top : x;
    }
    int32_t rgba[4] = {v[0], gray ? v[0] : v[1], gray ? v[0] : v[2], alpha ? v[count - 1] : top};
    for (int c = 0; c < channels; c++) {
      int32_t value = rgba[c];
      if (channels == 1 && !gray) {
        uint8_t px[3] = {(uint8_t)rgba[0], (uint8_t)rgba[1], (uint8_t)rgba[2]};
        value = luma(px);
      }
      if (wide)
        ((uint16_t *)sf_tensor_data(out))[i * (size_t)channels + (size_t)c] = (uint16_t)value;
      else
        ((uint8_t *)sf_tensor_data(out))[i * (size_t)channels + (size_t)c] = (uint8_t)value;
    }
  }
}

/*
 * A JPEG 2000 codestream or JP2 file through openjpeg, as Pillow unpacks it: 1 (gray), 2 (gray+alpha),
 * 3 (RGB) or 4 (RGBA) full-resolution components of one precision; samples shifted to 8 bits (signed ones
 * offset by half their range first), or, for one component deeper than 8 bits at depth 16/native, to 16 bits
 * (Pillow's I;16). Subsampled components (YCbCr 4:2:0) and other layouts are refused.
 */
static int decode_j2k(const uint8_t *p, size_t n, bool jp2, sf_image_mode mode, const sf_image_limits *limits,
                      sf_tensor *out, sf_error *error) {
  j2k_source src = {.data = p, .size = n};
  opj_codec_t *codec = opj_create_decompress(jp2 ? OPJ_CODEC_JP2 : OPJ_CODEC_J2K);
  opj_stream_t *stream = opj_stream_create(64 << 10, OPJ_TRUE);
  opj_image_t *image = NULL;
  int r = 0;
  if (!codec || !stream) {
    r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot create a JPEG 2000 decoder");
    goto done;
  }
  opj_set_error_handler(codec, j2k_error, &src);
  opj_set_warning_handler(codec, j2k_quiet, &src);
  opj_set_info_handler(codec, j2k_quiet, &src);
  opj_stream_set_read_function(stream, j2k_read);
  opj_stream_set_skip_function(stream, j2k_skip);
  opj_stream_set_seek_function(stream, j2k_seek);
  opj_stream_set_user_data(stream, &src, NULL);
  opj_stream_set_user_data_length(stream, n);
  opj_dparameters_t params;
  opj_set_default_decoder_parameters(&params);
  if (!opj_setup_decoder(codec, &params) || !opj_read_header(stream, codec, &image) || !image) {
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt JPEG 2000 header: %s",
                     src.message[0] ? src.message : "openjpeg cannot read it");
    goto done;
  }
  int64_t width = (int64_t)image->x1 - image->x0, height = (int64_t)image->y1 - image->y0;
  if ((r = check_pixels(width, height, limits, "JPEG 2000", error)) < 0) goto done;
  uint32_t count = image->numcomps;
  uint32_t prec = count ? image->comps[0].prec : 0;
  if (!j2k_supported(image)) {
    r = sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                     "JPEG 2000 with %u components is not supported (1-4 full-size components of one precision "
                     "up to 16 bits, gray or RGB)", count);
    goto done;
  }
  if (!opj_decode(codec, stream, image) || !opj_end_decompress(codec, stream)) {
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt JPEG 2000: %s",
                     src.message[0] ? src.message : "openjpeg cannot decode it");
    goto done;
  }
  for (uint32_t c = 0; c < count; c++)
    if (!image->comps[c].data || image->comps[c].w != (uint32_t)width || image->comps[c].h != (uint32_t)height) {
      r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt JPEG 2000: component %u is not %lldx%lld", c,
                       (long long)width, (long long)height);
      goto done;
    }
  bool gray = count <= 2, alpha = count == 2 || count == 4;
  bool wide = count == 1 && prec > 8 && wants_16(limits);
  if (count == 1 && prec > 8 && !wide) {
    r = sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                     "%u-bit grayscale JPEG 2000 needs decode's depth 16 or native (depth 8 makes 8-bit images)", prec);
    goto done;
  }
  int channels = channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  if ((r = alloc_image_of(out, wide ? SF_DTYPE_UINT16 : SF_DTYPE_UINT8, height, width, channels, error)) < 0)
    goto done;
  j2k_pixels(image, wide, channels, out);
  r = 0;
done:
  if (r < 0) sf_tensor_clear(out);
  if (image) opj_image_destroy(image);
  if (stream) opj_stream_destroy(stream);
  if (codec) opj_destroy_codec(codec);
  return r;
}

/* ---- AVIF ---------------------------------------------------------------------------------- */

/*
 * libavif and libjxl are opened on first use (engine/core/dynlib.h: they load some thirty libraries a
 * process that never meets the format should not pay for); their functions go through these tables.
 */
#define SF_FN_FIELD(name) __typeof__(&name) name;
#define SF_FN_NAME(name) #name,
#define AVIF_FUNCTIONS(X) X(avifDecoderCreate) X(avifDecoderDestroy) X(avifDecoderSetIOMemory) X(avifDecoderParse) \
  X(avifDecoderNextImage) X(avifRGBImageSetDefaults) X(avifImageYUVToRGB) X(avifResultToString)
#define JXL_FUNCTIONS(X) X(JxlSignatureCheck) X(JxlDecoderCreate) X(JxlDecoderDestroy) X(JxlDecoderSubscribeEvents) \
  X(JxlDecoderSetInput) X(JxlDecoderCloseInput) X(JxlDecoderProcessInput) X(JxlDecoderGetBasicInfo)               \
  X(JxlDecoderImageOutBufferSize) X(JxlDecoderSetImageOutBuffer)
static struct { AVIF_FUNCTIONS(SF_FN_FIELD) } avif;
static struct { JXL_FUNCTIONS(SF_FN_FIELD) } jxl;
static const char *const avif_symbols[] = {AVIF_FUNCTIONS(SF_FN_NAME) NULL};
static const char *const jxl_symbols[] = {JXL_FUNCTIONS(SF_FN_NAME) NULL};
static sf_dynlib avif_lib = {.soname = SF_AVIF_SONAME, .symbols = avif_symbols, .fns = &avif, .purpose = "decode AVIF images"};
static sf_dynlib jxl_lib = {.soname = SF_JXL_SONAME, .symbols = jxl_symbols, .fns = &jxl, .purpose = "decode JPEG XL images"};

/* An error record saying why a format's library is not there (lib->why). */
static int library_missing(sf_dynlib *lib, sf_error *error) {
  return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, "%s", lib->why);
}


/* An ISO-BMFF file whose ftyp box names an AVIF brand (major or compatible): HEIC and MP4 are not ours. */
static bool is_avif(const uint8_t *p, size_t n) {
  if (n < 16 || memcmp(p + 4, "ftyp", 4) != 0) return false;
  size_t box = (size_t)p[0] << 24 | (size_t)p[1] << 16 | (size_t)p[2] << 8 | p[3];
  if (box < 16 || box > n) box = n < 64 ? n : 64;
  for (size_t at = 8; at + 4 <= box; at += at == 8 ? 8 : 4)
    if (memcmp(p + at, "avif", 4) == 0 || memcmp(p + at, "avis", 4) == 0) return true;
  return false;
}

/*
 * The first (or only) image of an AVIF through libavif with dav1d, converted to 8-bit RGB(A) with
 * libavif's defaults (automatic chroma upsampling), as its avifdec does; deeper samples are scaled to 8
 * bits by libavif. Gray is Pillow's luma of that RGB. libavif's own size limit is set to max_pixels too.
 */
static int decode_avif(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                       sf_tensor *out, sf_error *error) {
  if (sf_dynlib_load(&avif_lib) < 0) return library_missing(&avif_lib, error);
  avifDecoder *decoder = avif.avifDecoderCreate();
  if (!decoder) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot create an AVIF decoder");
  int64_t max = max_pixels_of(limits);
  decoder->codecChoice = AVIF_CODEC_CHOICE_DAV1D;
  decoder->imageSizeLimit = max < AVIF_DEFAULT_IMAGE_SIZE_LIMIT ? (uint32_t)max : AVIF_DEFAULT_IMAGE_SIZE_LIMIT;
  decoder->ignoreExif = AVIF_TRUE;
  decoder->ignoreXMP = AVIF_TRUE;
  uint8_t *rgb_pixels = NULL;
  int r = 0;
  avifResult result = avif.avifDecoderSetIOMemory(decoder, p, n);
  if (result == AVIF_RESULT_OK) result = avif.avifDecoderParse(decoder);
  if (result != AVIF_RESULT_OK) {
    /* libavif refuses images over imageSizeLimit (our max_pixels) while parsing, before any allocation. */
    if (strstr(decoder->diag.error, "too large"))
      r = sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "AVIF over max_pixels %lld (%s); raise max_pixels if it is genuine",
                       (long long)max, decoder->diag.error);
    else
      r = sf_error_set(error, result == AVIF_RESULT_OUT_OF_MEMORY ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                       "corrupt AVIF: %s%s%s", avif.avifResultToString(result), decoder->diag.error[0] ? ": " : "",
                       decoder->diag.error);
    goto done;
  }
  avifImage *image = decoder->image;
  if ((r = check_pixels(image->width, image->height, limits, "AVIF", error)) < 0) goto done;
  if ((result = avif.avifDecoderNextImage(decoder)) != AVIF_RESULT_OK) {
    r = sf_error_set(error, result == AVIF_RESULT_OUT_OF_MEMORY ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                     "corrupt AVIF: %s%s%s", avif.avifResultToString(result), decoder->diag.error[0] ? ": " : "",
                     decoder->diag.error);
    goto done;
  }
  image = decoder->image;
  if ((r = check_pixels(image->width, image->height, limits, "AVIF", error)) < 0) goto done;
  /* An image with alpha is converted as RGBA, then cut: libavif's RGB output of it is not avifdec's pixels. */
  bool alpha = image->alphaPlane != NULL;
  int channels = channels_for(mode, alpha ? 4 : 3), decoded = alpha ? 4 : 3;
  if ((r = alloc_image(out, image->height, image->width, channels, error)) < 0) goto done;
  avifRGBImage rgb;
  avif.avifRGBImageSetDefaults(&rgb, image);
  rgb.depth = 8;
  rgb.format = decoded == 4 ? AVIF_RGB_FORMAT_RGBA : AVIF_RGB_FORMAT_RGB;
  rgb.rowBytes = image->width * (uint32_t)decoded;
  size_t pixels = (size_t)image->width * image->height;
  if (channels != decoded && !(rgb_pixels = malloc(pixels * (size_t)decoded))) {
    r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate %zu bytes for an AVIF", pixels * (size_t)decoded);
    goto done;
  }
  rgb.pixels = rgb_pixels ? rgb_pixels : sf_tensor_data(out);
  if ((result = avif.avifImageYUVToRGB(image, &rgb)) != AVIF_RESULT_OK) {
    r = sf_error_set(error, result == AVIF_RESULT_OUT_OF_MEMORY ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                     "AVIF to RGB: %s", avif.avifResultToString(result));
    goto done;
  }
  uint8_t *dst = sf_tensor_data(out);
  if (channels == 1)
    rgb_to_gray(rgb_pixels, decoded, dst, pixels);
  else if (channels != decoded)
    for (size_t i = 0; i < pixels; i++) memcpy(dst + i * 3, rgb_pixels + i * (size_t)decoded, 3);
  r = 0;
done:
  if (r < 0) sf_tensor_clear(out);
  free(rgb_pixels);
  avif.avifDecoderDestroy(decoder);
  return r;
}

/* ---- JPEG XL ------------------------------------------------------------------------------- */

/* libjxl's own check, reached only by bytes no other decoder claimed (PPM comes first: CIFAR never opens libjxl). */
static bool is_jxl(const uint8_t *p, size_t n) {
  if (sf_dynlib_load(&jxl_lib) < 0) return false;
  JxlSignature sig = jxl.JxlSignatureCheck(p, n);
  return sig == JXL_SIG_CODESTREAM || sig == JXL_SIG_CONTAINER;
}

/*
 * The first frame of a JPEG XL (codestream or container) through libjxl, as 8-bit samples in the
 * image's own channels (gray, gray+alpha, RGB, RGBA), as djxl writes them to PNG; XYB (lossy) images
 * come out in their original color space, libjxl's default. The size from the basic info is checked
 * against max_pixels before the output buffer exists and before any pixel is decoded.
 */
static int decode_jxl(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                      sf_tensor *out, sf_error *error) {
  if (sf_dynlib_load(&jxl_lib) < 0) return library_missing(&jxl_lib, error);
  JxlDecoder *dec = jxl.JxlDecoderCreate(NULL);
  if (!dec) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot create a JPEG XL decoder");
  uint8_t *pixels = NULL;
  size_t count = 0;
  JxlBasicInfo info;
  JxlPixelFormat format = {0, JXL_TYPE_UINT8, JXL_NATIVE_ENDIAN, 0};
  bool have_info = false, done = false;
  int r = 0;
  if (jxl.JxlDecoderSubscribeEvents(dec, JXL_DEC_BASIC_INFO | JXL_DEC_FULL_IMAGE) != JXL_DEC_SUCCESS ||
      jxl.JxlDecoderSetInput(dec, p, n) != JXL_DEC_SUCCESS) {
    r = sf_error_set(error, SF_EINTERNAL, SF_NOWHERE, "cannot set up the JPEG XL decoder");
    goto out;
  }
  jxl.JxlDecoderCloseInput(dec);
  while (!done) {
    JxlDecoderStatus status = jxl.JxlDecoderProcessInput(dec);
    switch (status) {
    case JXL_DEC_BASIC_INFO:
      if (jxl.JxlDecoderGetBasicInfo(dec, &info) != JXL_DEC_SUCCESS) goto corrupt;
      if ((r = check_pixels(info.xsize, info.ysize, limits, "JPEG XL", error)) < 0) goto out;
      format.num_channels = (info.num_color_channels == 1 ? 1 : 3) + (info.alpha_bits ? 1 : 0);
      have_info = true;
      break;
    case JXL_DEC_NEED_IMAGE_OUT_BUFFER: {
      size_t need = 0;
      count = (size_t)info.xsize * info.ysize;
      if (!have_info || jxl.JxlDecoderImageOutBufferSize(dec, &format, &need) != JXL_DEC_SUCCESS ||
          need != count * format.num_channels)
        goto corrupt;
      if (!(pixels = malloc(need))) {
        r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate %zu bytes for a JPEG XL", need);
        goto out;
      }
      if (jxl.JxlDecoderSetImageOutBuffer(dec, &format, pixels, need) != JXL_DEC_SUCCESS) goto corrupt;
      break;
    }
    case JXL_DEC_FULL_IMAGE: done = pixels != NULL; if (!done) goto corrupt; break;
    default: goto corrupt; /* JXL_DEC_ERROR, NEED_MORE_INPUT (truncated), SUCCESS without an image */
    }
  }
  bool gray = format.num_channels <= 2, alpha = format.num_channels == 2 || format.num_channels == 4;
  int stored = (int)format.num_channels, channels = channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  if ((r = alloc_image(out, info.ysize, info.xsize, channels, error)) < 0) goto out;
  uint8_t *dst = sf_tensor_data(out);
  for (size_t i = 0; i < count; i++, dst += channels) {
    const uint8_t *s = pixels + i * (size_t)stored;
    uint8_t rgba[4] = {s[0], gray ? s[0] : s[1], gray ? s[0] : s[2], alpha ? s[stored - 1] : 255};
    if (channels == 1)
      dst[0] = gray ? s[0] : luma(rgba);
    else
      memcpy(dst, rgba, (size_t)channels);
  }
  r = 0;
  goto out;
corrupt:
  r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt or truncated JPEG XL");
out:
  if (r < 0) sf_tensor_clear(out);
  free(pixels);
  jxl.JxlDecoderDestroy(dec);
  return r;
}

/* ---- PPM / PGM ----------------------------------------------------------------------------- */

/* Skips whitespace and '#' comments (to end of line), as netpbm allows between header tokens. */
static size_t pnm_skip(const uint8_t *p, size_t n, size_t i) {
  while (i < n) {
    if (p[i] == '#') {
      while (i < n && p[i] != '\n' && p[i] != '\r') i++;
    } else if (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r' || p[i] == '\v' ||
               p[i] == '\f') {
      i++;
    } else {
      break;
    }
  }
  return i;
}

/* Reads a decimal header number; returns -1 when there is none or it exceeds INT32_MAX. */
static int64_t pnm_number(const uint8_t *p, size_t n, size_t *i) {
  *i = pnm_skip(p, n, *i);
  int64_t v = -1;
  while (*i < n && p[*i] >= '0' && p[*i] <= '9') {
    v = (v < 0 ? 0 : v) * 10 + (p[*i] - '0');
    if (v > INT32_MAX) return -1;
    (*i)++;
  }
  return v;
}

static int decode_pnm(sf_buffer *buffer, size_t offset, size_t n, sf_image_mode mode,
                      const sf_image_limits *limits, sf_tensor *out, sf_error *error) {
  const uint8_t *p = sf_buffer_data(buffer) + offset;
  if (p[1] != '5' && p[1] != '6')
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, "PNM type P%c is not supported (binary P5/P6 only)", p[1]);
  int stored = p[1] == '6' ? 3 : 1;
  size_t i = 2;
  int64_t width = pnm_number(p, n, &i), height = pnm_number(p, n, &i), maxval = pnm_number(p, n, &i);
  if (width < 0 || height < 0 || maxval < 0 || i >= n)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt PNM header (expected width, height and maxval)");
  if (maxval == 0 || maxval > 65535)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "PNM maxval %lld is invalid", (long long)maxval);
  int bytes = maxval > 255 ? 2 : 1;
  if (bytes == 2 && !wants_16(limits))
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "PNM maxval %lld (16-bit) needs decode's depth 16 or native", (long long)maxval);
  if (bytes == 1 && maxval != 255)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "PNM maxval %lld is not supported (255, or 256-65535 at depth 16)", (long long)maxval);
  /* Exactly one whitespace byte separates maxval from the raster. */
  if (p[i] != ' ' && p[i] != '\t' && p[i] != '\n' && p[i] != '\r' && p[i] != '\v' && p[i] != '\f')
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt PNM header (no whitespace after maxval)");
  i++;
  int r = check_pixels(width, height, limits, "PNM", error);
  if (r < 0) return r;
  size_t pixels = (size_t)width * (size_t)height, need = pixels * (size_t)stored * (size_t)bytes;
  if (n - i < need)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "truncated PNM: %zu of %zu pixel bytes", n - i, need);
  int channels = channels_for(mode, stored);
  if (bytes == 2) {
    /* Big-endian samples, kept as stored (not rescaled to 65535), as numpy's '>u2' reads them. */
    if (channels == 1 && stored == 3)
      return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                          "a 16-bit PPM cannot be decoded to gray; use mode rgb or keep");
    if ((r = alloc_image_of(out, SF_DTYPE_UINT16, height, width, channels, error)) < 0) return r;
    uint16_t *dst = sf_tensor_data(out);
    const uint8_t *src = p + i;
    for (size_t k = 0; k < pixels; k++)
      for (int c = 0; c < channels; c++) {
        const uint8_t *s2 = src + 2 * (k * (size_t)stored + (stored == 3 ? (size_t)c : 0));
        dst[k * (size_t)channels + (size_t)c] = (uint16_t)(s2[0] << 8 | s2[1]);
      }
    return 0;
  }
  if (channels == stored) {
    const int64_t shape[3] = {height, width, channels};
    r = sf_tensor_view(out, SF_DTYPE_UINT8, 3, shape, sf_buffer_ref(buffer), offset + i);
    return r < 0 ? sf_error_set(error, r, SF_NOWHERE, "PNM pixels lie outside the buffer") : 0;
  }
  if ((r = alloc_image(out, height, width, channels, error)) < 0) return r;
  if (channels == 1)
    rgb_to_gray(p + i, 3, sf_tensor_data(out), pixels);
  else
    gray_to_rgb(p + i, sf_tensor_data(out), pixels);
  return 0;
}

/* ---- public -------------------------------------------------------------------------------- */

int sf_image_decode(const char *format, sf_buffer *buffer, size_t offset, size_t size,
                    sf_image_mode mode, const sf_image_limits *limits, sf_tensor *out,
                    sf_error *error) {
  memset(out, 0, sizeof *out);
  if (!buffer || offset > sf_buffer_size(buffer) || size > sf_buffer_size(buffer) - offset ||
      (unsigned)mode > SF_IMAGE_KEEP)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "bad arguments to sf_image_decode");
  const uint8_t *p = sf_buffer_data(buffer) + offset;
  /* The bytes decide, not the name (as in Pillow): real datasets hold PNGs named .jpg. */
  int r = 1; /* no decoder matched */
  if (size >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF)
    r = decode_jpeg(p, size, mode, limits, out, error);
  else if (size >= sizeof png_signature && memcmp(p, png_signature, sizeof png_signature) == 0)
    r = decode_png(p, size, mode, limits, out, error);
  else if (is_webp(p, size))
    r = decode_webp(p, size, mode, limits, out, error);
  else if (size >= 4 && (memcmp(p, "II*\0", 4) == 0 || memcmp(p, "MM\0*", 4) == 0 ||
                         memcmp(p, "II+\0", 4) == 0 || memcmp(p, "MM\0+", 4) == 0))
    r = decode_tiff(p, size, mode, limits, out, error);
  else if (size >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0))
    r = limits && limits->gif_frames ? decode_gif_frames(p, size, mode, limits, out, error)
                                     : decode_gif(p, size, mode, limits, out, error);
  else if (size >= sizeof jp2_signature && memcmp(p, jp2_signature, sizeof jp2_signature) == 0)
    r = decode_j2k(p, size, true, mode, limits, out, error);
  else if (size >= 4 && p[0] == 0xFF && p[1] == 0x4F && p[2] == 0xFF && p[3] == 0x51)
    r = decode_j2k(p, size, false, mode, limits, out, error);
  else if (size >= 2 && p[0] == 'P' && p[1] >= '1' && p[1] <= '7')
    r = decode_pnm(buffer, offset, size, mode, limits, out, error);
  else if (is_avif(p, size))
    r = decode_avif(p, size, mode, limits, out, error);
  else if (is_jxl(p, size))
    r = decode_jxl(p, size, mode, limits, out, error);
  if (r == 0 && limits && limits->depth == 16 && out->dtype == SF_DTYPE_UINT8 && out->ndim == 3)
    r = widen_to_16(out, error);
  if (r != 1) return r;
  return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                      "not a JPEG, PNG, WebP, TIFF, GIF, JPEG 2000, AVIF, JPEG XL or PPM/PGM image (named .%s, %zu bytes starting %02x %02x %02x %02x)",
                      format ? format : "?", size, size > 0 ? p[0] : 0, size > 1 ? p[1] : 0, size > 2 ? p[2] : 0,
                      size > 3 ? p[3] : 0);
}

int sf_image_format_known(const char *format) {
  static const char *const known[] = {"jpg", "jpeg", "png", "ppm", "pgm", "pnm", "webp", "tif", "tiff", "gif", "jp2", "j2k", "j2c", "jpc", "jpf", "jpx", "avif", "jxl", NULL};
  /* Asked for every field of every sample: most names (cls, txt, json) fail on the first letter. */
  if (!format) return 0;
  int first = format[0] | 0x20;
  if (first != 'j' && first != 'p' && first != 'w' && first != 't' && first != 'g' && first != 'a') return 0;
  for (int i = 0; known[i]; i++)
    if (strcasecmp(format, known[i]) == 0) return 1;
  return 0;
}

static void free_malloced(void *opaque, uint8_t *data) {
  (void)opaque;
  free(data);
}

static void free_turbojpeg(void *opaque, uint8_t *data) {
  (void)opaque;
  tjFree(data);
}

/* Wraps encoder output; on failure frees it with free_fn, since the wrap did not take it. */
static int wrap_output(uint8_t *data, size_t size, sf_buffer_free_fn free_fn, sf_buffer **out,
                       sf_error *error) {
  *out = sf_buffer_wrap(data, size, free_fn, NULL);
  if (*out) return 0;
  free_fn(NULL, data);
  return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate an image buffer");
}

static int encode_pnm(const uint8_t *pixels, int64_t h, int64_t w, int c, sf_buffer **out,
                      sf_error *error) {
  char header[64];
  int hn = snprintf(header, sizeof header, "P%c\n%lld %lld\n255\n", c == 3 ? '6' : '5',
                    (long long)w, (long long)h);
  size_t bytes = (size_t)(h * w * c);
  *out = sf_buffer_new((size_t)hn + bytes);
  if (!*out) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate a %zu-byte PNM", (size_t)hn + bytes);
  memcpy(sf_buffer_data(*out), header, (size_t)hn);
  memcpy(sf_buffer_data(*out) + hn, pixels, bytes);
  return 0;
}

static int encode_png(const uint8_t *pixels, int64_t h, int64_t w, int c, sf_buffer **out,
                      sf_error *error) {
  spng_ctx *ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  if (!ctx) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot create a PNG encoder");
  struct spng_ihdr ihdr = {
      .width = (uint32_t)w,
      .height = (uint32_t)h,
      .bit_depth = 8,
      .color_type = c == 1   ? SPNG_COLOR_TYPE_GRAYSCALE
                    : c == 3 ? SPNG_COLOR_TYPE_TRUECOLOR
                             : SPNG_COLOR_TYPE_TRUECOLOR_ALPHA,
  };
  int r = spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  if (!r) r = spng_set_ihdr(ctx, &ihdr);
  if (!r) r = spng_encode_image(ctx, pixels, (size_t)(h * w * c), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  size_t len = 0;
  uint8_t *png = r ? NULL : spng_get_png_buffer(ctx, &len, &r);
  spng_ctx_free(ctx);
  if (!png) return sf_error_set(error, spng_code(r), SF_NOWHERE, "PNG encoder: %s", spng_strerror(r));
  return wrap_output(png, len, free_malloced, out, error);
}

static int encode_jpeg(const uint8_t *pixels, int64_t h, int64_t w, int c, int quality,
                       sf_buffer **out, sf_error *error) {
  if (quality < 1 || quality > 100)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "JPEG quality %d is not in 1..100", quality);
  tjhandle tj = tjInitCompress();
  if (!tj) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot create a TurboJPEG compressor");
  unsigned char *jpeg = NULL;
  unsigned long len = 0;
  int r = tjCompress2(tj, pixels, (int)w, 0, (int)h, c == 1 ? TJPF_GRAY : TJPF_RGB, &jpeg, &len,
                      c == 1 ? TJSAMP_GRAY : TJSAMP_420, quality, 0);
  if (r != 0) {
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "JPEG encoder: %s", tjGetErrorStr2(tj));
    tjFree(jpeg);
    tjDestroy(tj);
    return r;
  }
  tjDestroy(tj);
  return wrap_output(jpeg, len, free_turbojpeg, out, error);
}

int sf_image_encode(const char *format, const sf_tensor *image, int quality, sf_buffer **out,
                    sf_error *error) {
  *out = NULL;
  if (!format || !image || image->dtype != SF_DTYPE_UINT8 || image->ndim != 3 || !image->buffer)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "images to encode are uint8 [H, W, C] tensors");
  int64_t h = image->shape[0], w = image->shape[1], c = image->shape[2];
  bool pnm = strcasecmp(format, "pnm") == 0, ppm = strcasecmp(format, "ppm") == 0,
       pgm = strcasecmp(format, "pgm") == 0, png = strcasecmp(format, "png") == 0,
       jpg = strcasecmp(format, "jpg") == 0 || strcasecmp(format, "jpeg") == 0;
  if (!(pnm || ppm || pgm || png || jpg))
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "cannot encode format \"%s\"", format);
  if (h <= 0 || w <= 0 || h > 65500 || w > 65500)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "cannot encode a %lldx%lld image", (long long)h, (long long)w);
  if ((ppm && c != 3) || (pgm && c != 1) || (c != 1 && c != 3 && !(png && c == 4)))
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "cannot encode %lld channels as %s", (long long)c, format);
  /* The encoders read packed rows; gather a strided view first. */
  const uint8_t *pixels = sf_tensor_data(image);
  uint8_t *packed = NULL;
  if (!sf_tensor_is_contiguous(image)) {
    packed = malloc((size_t)(h * w * c));
    if (!packed) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate an image");
    uint8_t *d = packed;
    for (int64_t y = 0; y < h; y++)
      for (int64_t x = 0; x < w; x++)
        for (int64_t k = 0; k < c; k++)
          *d++ = pixels[y * image->strides[0] + x * image->strides[1] + k * image->strides[2]];
    pixels = packed;
  }
  int r = png ? encode_png(pixels, h, w, (int)c, out, error)
          : jpg ? encode_jpeg(pixels, h, w, (int)c, quality, out, error)
                : encode_pnm(pixels, h, w, (int)c, out, error);
  free(packed);
  return r;
}
