/* Region decode of JPEG fields through the libjpeg API (libjpeg-turbo 2.1: jpeg_crop_scanline, jpeg_skip_scanlines). */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "jpeg_region.h"
#include "pixels.h"

/* libjpeg reports errors by calling error_exit: jump back with its message instead of exit(). */
typedef struct jpeg_errors {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
} jpeg_errors;

static void on_error(j_common_ptr cinfo) {
  jpeg_errors *e = (jpeg_errors *)cinfo->err;
  e->pub.format_message(cinfo, e->message);
  longjmp(e->jump, 1);
}

/* A warning (level -1) means corrupt data (a bad Huffman code, a truncation): an error here, as
   TJFLAG_STOPONWARNING makes it for the full decode. Trace messages (level >= 0) are ignored. */
static void on_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_error(cinfo);
}

/* A decompressor whose errors and warnings jump to e->jump (the caller's setjmp comes next). */
static void create_decompress(struct jpeg_decompress_struct *cinfo, jpeg_errors *e) {
  cinfo->err = jpeg_std_error(&e->pub);
  e->pub.error_exit = on_error;
  e->pub.emit_message = on_message;
  jpeg_create_decompress(cinfo);
}

int sf_jpeg_probe(const sf_tensor *t, sf_image_mode mode, const sf_image_limits *limits, sf_jpeg_source *out) {
  const uint8_t *p = sf_tensor_data(t);
  size_t n = (size_t)t->shape[0];
  if (mode == SF_IMAGE_KEEP || (limits && (limits->min_size > 0 || limits->depth != 8)) || n < 3 ||
      p[0] != 0xFF || p[1] != 0xD8 || p[2] != 0xFF)
    return 0;
  struct jpeg_decompress_struct cinfo;
  jpeg_errors e;
  create_decompress(&cinfo, &e);
  if (setjmp(e.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return 0; /* sf_image_decode will say what is wrong */
  }
  jpeg_mem_src(&cinfo, p, (unsigned long)n);
  jpeg_read_header(&cinfo, TRUE);
  int64_t w = cinfo.image_width, h = cinfo.image_height;
  int64_t max = limits && limits->max_pixels > 0 ? limits->max_pixels : 100000000;
  bool ok = !cinfo.progressive_mode && cinfo.data_precision == 8 && w > 0 && h > 0 && w <= max / h &&
            (cinfo.jpeg_color_space == JCS_GRAYSCALE || cinfo.jpeg_color_space == JCS_YCbCr ||
             cinfo.jpeg_color_space == JCS_RGB);
  jpeg_destroy_decompress(&cinfo);
  if (!ok) return 0;
  *out = (sf_jpeg_source){.mode = mode, .width = (int)w, .height = (int)h, .channels = mode == SF_IMAGE_GRAY ? 1 : 3};
  if (limits) out->limits = *limits;
  sf_tensor_ref(&out->bytes, t);
  return 1;
}

int sf_jpeg_dct_scale(int64_t h, int64_t w, int64_t min_h, int64_t min_w) {
  /* Powers of two only: libjpeg-turbo 2.1 has SIMD IDCTs for 8/8, 4/8 and 2/8 (1/8 is one value a
     block), the other M/8 are scalar and measured slower than decoding at the next power of two. */
  int m = 8;
  while (m > 1 && h * (m / 2) / 8 >= min_h && w * (m / 2) / 8 >= min_w) m /= 2;
  return m;
}

int64_t sf_jpeg_scaled(int64_t v, int m) { return (v * m + 7) / 8; }

int sf_jpeg_decode_region(const sf_jpeg_source *src, int m, bool fast, const int64_t rect[4], sf_tensor *out,
                          int64_t *x0, sf_error *error) {
  memset(out, 0, sizeof *out);
  struct jpeg_decompress_struct cinfo;
  jpeg_errors e;
  create_decompress(&cinfo, &e);
  if (setjmp(e.jump)) {
    sf_tensor_clear(out);
    jpeg_destroy_decompress(&cinfo);
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt JPEG: %s", e.message);
  }
  jpeg_mem_src(&cinfo, sf_tensor_data(&src->bytes), (unsigned long)src->bytes.shape[0]);
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = src->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  cinfo.scale_num = (unsigned)m;
  cinfo.scale_denom = 8;
  /* Accurate integer IDCT and fancy upsampling: TurboJPEG's defaults, so M = 8 gives its pixels. fast
     takes the fast integer IDCT and keeps fancy upsampling: plain upsampling of a cropped region goes
     through libjpeg's row copies (jcopy_sample_rows), not its SIMD, and measured 7% more CPU for the
     ImageNet-like graph than fancy. */
  cinfo.dct_method = fast ? JDCT_IFAST : JDCT_ISLOW;
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo);
  int64_t sw = cinfo.output_width, sh = cinfo.output_height;
  if (rect[0] < 0 || rect[2] > sh || rect[0] >= rect[2] || rect[1] < 0 || rect[3] > sw || rect[1] >= rect[3])
    longjmp(e.jump, (snprintf(e.message, sizeof e.message, "region outside the %lldx%lld image", (long long)sw,
                              (long long)sh), 1));
  int64_t top = rect[0], bottom = rect[2];
  /* One more column each side: chroma upsampling replicates the edge column of a cropped region,
     so the rectangle's own edge columns come out as the full decode has them only when inside it. */
  JDIMENSION xoff = (JDIMENSION)(rect[1] > 0 ? rect[1] - 1 : 0);
  JDIMENSION width = (JDIMENSION)(rect[3] < sw ? rect[3] + 1 : sw) - xoff;
  jpeg_crop_scanline(&cinfo, &xoff, &width);
  if (top > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)top) != (JDIMENSION)top)
    longjmp(e.jump, (snprintf(e.message, sizeof e.message, "fewer rows than the header says"), 1));
  if (sf_pixels_alloc(out, SF_DTYPE_UINT8, bottom - top, cinfo.output_width, src->channels) < 0) {
    jpeg_destroy_decompress(&cinfo);
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate a %lldx%u region", (long long)(bottom - top),
                        cinfo.output_width);
  }
  uint8_t *rows = sf_tensor_data(out);
  size_t stride = (size_t)cinfo.output_width * (size_t)src->channels;
  /* As many rows a call as libjpeg gives (an iMCU row's worth): a call a row costs its dispatch a row. */
  enum { BATCH = 16 };
  JSAMPROW row[BATCH];
  while (cinfo.output_scanline < (JDIMENSION)bottom) {
    JDIMENSION want = (JDIMENSION)bottom - cinfo.output_scanline;
    if (want > BATCH) want = BATCH;
    for (JDIMENSION i = 0; i < want; i++) row[i] = rows + (cinfo.output_scanline + i - (JDIMENSION)top) * stride;
    if (jpeg_read_scanlines(&cinfo, row, want) == 0)
      longjmp(e.jump, (snprintf(e.message, sizeof e.message, "data ends early"), 1));
  }
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  *x0 = rect[1] - (int64_t)xoff;
  return 0;
}
