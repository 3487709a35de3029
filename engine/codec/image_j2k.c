/* JPEG 2000 fields (JP2 files and codestreams) through openjpeg, as Pillow unpacks them (image_formats.h). */
#include <string.h>

#include <openjpeg.h>

#include "image_formats.h"

/* ---- JPEG 2000 ----------------------------------------------------------------------------- */

static const uint8_t jp2_signature[12] = {0, 0, 0, 12, 'j', 'P', ' ', ' ', 13, 10, 0x87, 10};

bool sf_image_is_jp2(const uint8_t *p, size_t n) {
  return n >= sizeof jp2_signature && memcmp(p, jp2_signature, sizeof jp2_signature) == 0;
}

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
        value = sf_image_luma(px);
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
int sf_image_decode_j2k(const uint8_t *p, size_t n, bool jp2, sf_image_mode mode, const sf_image_limits *limits,
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
  if ((r = sf_image_check_pixels(width, height, limits, "JPEG 2000", error)) < 0) goto done;
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
  bool wide = count == 1 && prec > 8 && sf_image_wants_16(limits);
  if (count == 1 && prec > 8 && !wide) {
    r = sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                     "%u-bit grayscale JPEG 2000 needs decode's depth 16 or native (depth 8 makes 8-bit images)", prec);
    goto done;
  }
  int channels = sf_image_channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  if ((r = sf_image_alloc_of(out, wide ? SF_DTYPE_UINT16 : SF_DTYPE_UINT8, height, width, channels, error)) < 0)
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
