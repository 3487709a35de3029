/* TIFF fields through libtiff, as Pillow decodes them (image_formats.h). */
#include <stdlib.h>
#include <string.h>

#include <tiffio.h>

#include "image_formats.h"

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
  } else if ((r = sf_image_alloc(out, height, width, channels, error)) == 0) {
    /* cmyk_to_rgb takes Adobe-inverted samples (as JPEG's CMYK comes): invert TIFF's plain ones. */
    uint8_t *dst = sf_tensor_data(out);
    for (size_t i = 0; i < pixels; i++) {
      uint8_t inverted[4], rgb[3];
      for (int c = 0; c < 4; c++) inverted[c] = (uint8_t)(255 - cmyk[i * 4 + c]);
      sf_image_cmyk_to_rgb(inverted, channels == 3 ? dst + i * 3 : rgb, 1);
      if (channels == 1) dst[i] = sf_image_luma(rgb);
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
  const bool alpha = spp == color + 1, gray = color == 1 && !alpha, wide = t->bits == 16 && sf_image_wants_16(limits);
  const int channels = sf_image_channels_for(mode, alpha ? 4 : gray ? 1 : 3);
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
  } else if ((r = sf_image_alloc_of(out, wide ? SF_DTYPE_UINT16 : SF_DTYPE_UINT8, t->height, t->width, channels,
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
        v[0] = sf_image_luma(rgb);
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
  const int channels = sf_image_channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  const size_t pixels = (size_t)t->width * t->height;
  uint8_t *raw = malloc(pixels * 4);
  if (!raw) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate a %ux%u TIFF", t->width, t->height);
  int r;
  /* stop on error: a damaged strip is an error, not a gray band. */
  if (!TIFFReadRGBAImageOriented(tif, t->width, t->height, (uint32_t *)(void *)raw, ORIENTATION_TOPLEFT, 1)) {
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt TIFF: %s",
                     src->message[0] ? src->message : "cannot read its pixels");
  } else if ((r = sf_image_alloc(out, t->height, t->width, channels, error)) == 0) {
    uint8_t *dst = sf_tensor_data(out);
    for (size_t i = 0; i < pixels; i++) {
      uint32_t abgr = ((const uint32_t *)(const void *)raw)[i];
      uint8_t rgba[4] = {(uint8_t)TIFFGetR(abgr), (uint8_t)TIFFGetG(abgr), (uint8_t)TIFFGetB(abgr),
                         (uint8_t)TIFFGetA(abgr)};
      if (channels == 1)
        dst[i] = gray ? rgba[0] : sf_image_luma(rgba);
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
int sf_image_decode_tiff(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
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
  if ((r = sf_image_check_pixels(t.width, t.height, limits, "TIFF", error)) < 0) goto done;
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
