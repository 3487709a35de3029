/* The web's newer image formats: WebP (libwebp), AVIF (libavif with dav1d) and JPEG XL (libjxl), the last two opened on first use (image_formats.h). */
#include <stdlib.h>
#include <string.h>

#include <avif/avif.h>
#include <jxl/decode.h>
#include <webp/decode.h>

#include "dynlib.h"
#include "image_formats.h"

/* ---- WebP ---------------------------------------------------------------------------------- */

bool sf_image_is_webp(const uint8_t *p, size_t n) {
  return n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0;
}

/*
 * A still WebP (lossy or lossless) through libwebp's simple decoder, RGB or RGBA as the mode asks:
 * the first frame's pixels as Pillow reads them (its WebPAnimDecoder decodes a key frame straight into
 * a cleared canvas, non-premultiplied). Gray is Pillow's luma of the RGB. Animated files are refused.
 */
int sf_image_decode_webp(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                       sf_tensor *out, sf_error *error) {
  WebPBitstreamFeatures features;
  VP8StatusCode status = WebPGetFeatures(p, n, &features);
  if (status != VP8_STATUS_OK)
    return sf_error_set(error, status == VP8_STATUS_OUT_OF_MEMORY ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                        "corrupt WebP header (libwebp status %d)", (int)status);
  if (features.has_animation)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, "animated WebP is not supported (still images only)");
  int r = sf_image_check_pixels(features.width, features.height, limits, "WebP", error);
  if (r < 0) return r;
  int channels = sf_image_channels_for(mode, features.has_alpha ? 4 : 3);
  int decoded = channels == 1 ? 3 : channels;
  size_t pixels = (size_t)features.width * (size_t)features.height;
  uint8_t *rgb = NULL;
  if ((r = sf_image_alloc(out, features.height, features.width, channels, error)) < 0) return r;
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
  if (rgb) sf_image_rgb_to_gray(rgb, 3, sf_tensor_data(out), pixels);
  free(rgb);
  return 0;
}

/* ---- AVIF ---------------------------------------------------------------------------------- */

/*
 * libavif and libjxl are opened on first use (engine/core/dynlib.h: they load some thirty libraries a
 * process that never meets the format should not pay for); their functions go through these tables.
 */
#define AVIF_FUNCTIONS(X) X(avifDecoderCreate) X(avifDecoderDestroy) X(avifDecoderSetIOMemory) X(avifDecoderParse) \
  X(avifDecoderNextImage) X(avifRGBImageSetDefaults) X(avifImageYUVToRGB) X(avifResultToString)
#define JXL_FUNCTIONS(X) X(JxlSignatureCheck) X(JxlDecoderCreate) X(JxlDecoderDestroy) X(JxlDecoderSubscribeEvents) \
  X(JxlDecoderSetInput) X(JxlDecoderCloseInput) X(JxlDecoderProcessInput) X(JxlDecoderGetBasicInfo)               \
  X(JxlDecoderImageOutBufferSize) X(JxlDecoderSetImageOutBuffer)
static struct { AVIF_FUNCTIONS(SF_DYNLIB_FIELD) } avif;
static struct { JXL_FUNCTIONS(SF_DYNLIB_FIELD) } jxl;
static const char *const avif_symbols[] = {AVIF_FUNCTIONS(SF_DYNLIB_NAME) NULL};
static const char *const jxl_symbols[] = {JXL_FUNCTIONS(SF_DYNLIB_NAME) NULL};
static sf_dynlib avif_lib = {.soname = SF_AVIF_SONAME, .symbols = avif_symbols, .fns = &avif, .purpose = "decode AVIF images"};
static sf_dynlib jxl_lib = {.soname = SF_JXL_SONAME, .symbols = jxl_symbols, .fns = &jxl, .purpose = "decode JPEG XL images"};

/* An error record saying why a format's library is not there (lib->why). */
static int library_missing(sf_dynlib *lib, sf_error *error) {
  return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, "%s", lib->why);
}


/* An ISO-BMFF file whose ftyp box names an AVIF brand (major or compatible): HEIC and MP4 are not ours. */
bool sf_image_is_avif(const uint8_t *p, size_t n) {
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
int sf_image_decode_avif(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                       sf_tensor *out, sf_error *error) {
  if (sf_dynlib_load(&avif_lib) < 0) return library_missing(&avif_lib, error);
  avifDecoder *decoder = avif.avifDecoderCreate();
  if (!decoder) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot create an AVIF decoder");
  int64_t max = sf_image_max_pixels(limits);
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
  if ((r = sf_image_check_pixels(image->width, image->height, limits, "AVIF", error)) < 0) goto done;
  if ((result = avif.avifDecoderNextImage(decoder)) != AVIF_RESULT_OK) {
    r = sf_error_set(error, result == AVIF_RESULT_OUT_OF_MEMORY ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                     "corrupt AVIF: %s%s%s", avif.avifResultToString(result), decoder->diag.error[0] ? ": " : "",
                     decoder->diag.error);
    goto done;
  }
  image = decoder->image;
  if ((r = sf_image_check_pixels(image->width, image->height, limits, "AVIF", error)) < 0) goto done;
  /* An image with alpha is converted as RGBA, then cut: libavif's RGB output of it is not avifdec's pixels. */
  bool alpha = image->alphaPlane != NULL;
  int channels = sf_image_channels_for(mode, alpha ? 4 : 3), decoded = alpha ? 4 : 3;
  if ((r = sf_image_alloc(out, image->height, image->width, channels, error)) < 0) goto done;
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
    sf_image_rgb_to_gray(rgb_pixels, decoded, dst, pixels);
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
bool sf_image_is_jxl(const uint8_t *p, size_t n) {
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
int sf_image_decode_jxl(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
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
      if ((r = sf_image_check_pixels(info.xsize, info.ysize, limits, "JPEG XL", error)) < 0) goto out;
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
  int stored = (int)format.num_channels, channels = sf_image_channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  if ((r = sf_image_alloc(out, info.ysize, info.xsize, channels, error)) < 0) goto out;
  uint8_t *dst = sf_tensor_data(out);
  for (size_t i = 0; i < count; i++, dst += channels) {
    const uint8_t *s = pixels + i * (size_t)stored;
    uint8_t rgba[4] = {s[0], gray ? s[0] : s[1], gray ? s[0] : s[2], alpha ? s[stored - 1] : 255};
    if (channels == 1)
      dst[0] = gray ? s[0] : sf_image_luma(rgba);
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
