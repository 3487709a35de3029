/* Image codecs: JPEG (TurboJPEG), PNG (libspng) and binary PPM/PGM to uint8 [H,W,C] tensors and back (encoding:
   JPEG, PNG, PPM/PGM); the helpers every decoder shares; and sf_image_decode, which picks the decoder by the
   bytes. WebP, AVIF and JPEG XL are in image_web.c, TIFF in image_tiff.c, GIF in image_gif.c, JPEG 2000 in
   image_j2k.c. */
#include <pthread.h>
#include <string.h>

#include <spng.h>
#include <turbojpeg.h>

#include "image_formats.h"
#include "pixels.h"

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

/* depth 16: an 8-bit result becomes uint16 with v * 257 (0 -> 0, 255 -> 65535), as a 16-bit writer stores it. */
static int widen_to_16(sf_tensor *image, sf_error *error) {
  sf_tensor wide;
  const uint8_t *src = sf_tensor_data(image);
  int r = sf_image_alloc_of(&wide, SF_DTYPE_UINT16, image->shape[0], image->shape[1], (int)image->shape[2], error);
  if (r < 0) return r;
  uint16_t *dst = sf_tensor_data(&wide);
  for (int64_t i = 0, n = sf_tensor_numel(image); i < n; i++)
    dst[i] = (uint16_t)(src[i] * 257u);
  sf_tensor_clear(image);
  *image = wide;
  return 0;
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
  if ((r = sf_image_check_pixels(width, height, limits, "JPEG", error)) < 0) goto done;
  bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  int max_scans = limits && limits->max_scans > 0 ? limits->max_scans : DEFAULT_MAX_SCANS;
  int scans = jpeg_scan_count(p, n);
  if (scans > max_scans) {
    r = sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, "JPEG has %d scans, over max_scans %d", scans, max_scans);
    goto done;
  }
  int stored = colorspace == TJCS_GRAY ? 1 : 3;
  int channels = sf_image_channels_for(mode, stored);
  int scaled_w, scaled_h;
  jpeg_scaled_size(width, height, limits ? limits->min_size : 0, &scaled_w, &scaled_h);
  if ((r = sf_image_alloc(out, scaled_h, scaled_w, channels, error)) < 0) goto done;
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
      sf_image_cmyk_to_rgb(cmyk_pixels, sf_tensor_data(out), count);
    } else {
      /* gray: Pillow's convert('L') of the RGB it would have made. */
      uint8_t rgb[3];
      for (size_t i = 0; i < count; i++) {
        sf_image_cmyk_to_rgb(cmyk_pixels + 4 * i, rgb, 1);
        ((uint8_t *)sf_tensor_data(out))[i] = sf_image_luma(rgb);
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
  int channels = sf_image_channels_for(mode, gray ? 1 : alpha ? 4 : 3);
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
  } else if ((r = sf_image_alloc_of(out, SF_DTYPE_UINT16, ihdr->height, ihdr->width, channels, error)) == 0) {
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
  int64_t max = sf_image_max_pixels(limits);
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
  if ((r = sf_image_check_pixels(ihdr.width, ihdr.height, limits, "PNG", error)) < 0) goto done;
  bool gray = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE;
  int trns_r = spng_get_trns(ctx, &trns);
  if (trns_r && trns_r != SPNG_ECHUNKAVAIL) {
    r = sf_error_set(error, spng_code(trns_r), SF_NOWHERE, "corrupt PNG: %s", spng_strerror(trns_r));
    goto done;
  }
  if (ihdr.bit_depth == 16 && sf_image_wants_16(limits)) {
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
  int channels = sf_image_channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  /* libspng converts 16-bit samples by taking the high byte, as Pillow's RGB;16B unpackers do. */
  int fmt = channels == 4 ? SPNG_FMT_RGBA8 : (channels == 1 && gray) ? SPNG_FMT_G8 : SPNG_FMT_RGB8;
  int flags = fmt == SPNG_FMT_RGBA8 ? SPNG_DECODE_TRNS : 0;
  size_t pixels = (size_t)ihdr.width * ihdr.height, len;
  if ((r = spng_decoded_image_size(ctx, fmt, &len)) != 0) {
    r = sf_error_set(error, spng_code(r), SF_NOWHERE, "PNG: %s", spng_strerror(r));
    goto done;
  }
  if ((r = sf_image_alloc(out, ihdr.height, ihdr.width, channels, error)) < 0) goto done;
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
  if (rgb) sf_image_rgb_to_gray(rgb, 3, sf_tensor_data(out), pixels);
  r = 0;
done:
  if (r < 0) sf_tensor_clear(out);
  free(rgb);
  spng_ctx_free(ctx);
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
  if (bytes == 2 && !sf_image_wants_16(limits))
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "PNM maxval %lld (16-bit) needs decode's depth 16 or native", (long long)maxval);
  if (bytes == 1 && maxval != 255)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        "PNM maxval %lld is not supported (255, or 256-65535 at depth 16)", (long long)maxval);
  /* Exactly one whitespace byte separates maxval from the raster. */
  if (p[i] != ' ' && p[i] != '\t' && p[i] != '\n' && p[i] != '\r' && p[i] != '\v' && p[i] != '\f')
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt PNM header (no whitespace after maxval)");
  i++;
  int r = sf_image_check_pixels(width, height, limits, "PNM", error);
  if (r < 0) return r;
  size_t pixels = (size_t)width * (size_t)height, need = pixels * (size_t)stored * (size_t)bytes;
  if (n - i < need)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "truncated PNM: %zu of %zu pixel bytes", n - i, need);
  int channels = sf_image_channels_for(mode, stored);
  if (bytes == 2) {
    /* Big-endian samples, kept as stored (not rescaled to 65535), as numpy's '>u2' reads them. */
    if (channels == 1 && stored == 3)
      return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                          "a 16-bit PPM cannot be decoded to gray; use mode rgb or keep");
    if ((r = sf_image_alloc_of(out, SF_DTYPE_UINT16, height, width, channels, error)) < 0) return r;
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
  if ((r = sf_image_alloc(out, height, width, channels, error)) < 0) return r;
  if (channels == 1)
    sf_image_rgb_to_gray(p + i, 3, sf_tensor_data(out), pixels);
  else
    sf_image_gray_to_rgb(p + i, sf_tensor_data(out), pixels);
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
  else if (sf_image_is_webp(p, size))
    r = sf_image_decode_webp(p, size, mode, limits, out, error);
  else if (size >= 4 && (memcmp(p, "II*\0", 4) == 0 || memcmp(p, "MM\0*", 4) == 0 ||
                         memcmp(p, "II+\0", 4) == 0 || memcmp(p, "MM\0+", 4) == 0))
    r = sf_image_decode_tiff(p, size, mode, limits, out, error);
  else if (size >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0))
    r = limits && limits->gif_frames ? sf_image_decode_gif_frames(p, size, mode, limits, out, error)
                                     : sf_image_decode_gif(p, size, mode, limits, out, error);
  else if (sf_image_is_jp2(p, size))
    r = sf_image_decode_j2k(p, size, true, mode, limits, out, error);
  else if (size >= 4 && p[0] == 0xFF && p[1] == 0x4F && p[2] == 0xFF && p[3] == 0x51)
    r = sf_image_decode_j2k(p, size, false, mode, limits, out, error);
  else if (size >= 2 && p[0] == 'P' && p[1] >= '1' && p[1] <= '7')
    r = decode_pnm(buffer, offset, size, mode, limits, out, error);
  else if (sf_image_is_avif(p, size))
    r = sf_image_decode_avif(p, size, mode, limits, out, error);
  else if (sf_image_is_jxl(p, size))
    r = sf_image_decode_jxl(p, size, mode, limits, out, error);
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
