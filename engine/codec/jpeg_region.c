/* Region decode of JPEG fields through the libjpeg API (libjpeg-turbo 2.1: jpeg_crop_scanline, jpeg_skip_scanlines). */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#include "jpeg_entries.h"
#include "jpeg_region.h"
#include "jpeg_scan.h"
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

/*
 * Where a region decode starts: the JPEG itself (head = NULL), or a head of sf_jpeg_scan_resume's followed by the
 * JPEG's bytes from rest on, whose pixel rows are the JPEG's less the first `shift`.
 */
typedef struct start {
  uint8_t *head;
  size_t head_size;
  const uint8_t *rest;
  size_t rest_size;
  int64_t shift;
} start;

/* libjpeg's source for a resumed decode: the head, then the rest; past their end an EOI after a warning, as
   jpeg_mem_src gives. */
typedef struct two_part_source {
  struct jpeg_source_mgr pub;
  const start *at;
  bool in_rest;
} two_part_source;

static void source_init(j_decompress_ptr cinfo) { (void)cinfo; }

static boolean source_fill(j_decompress_ptr cinfo) {
  static const JOCTET eoi[2] = {0xFF, JPEG_EOI};
  two_part_source *s = (two_part_source *)cinfo->src;
  if (!s->in_rest && s->at->rest_size) {
    s->in_rest = true;
    s->pub.next_input_byte = s->at->rest, s->pub.bytes_in_buffer = s->at->rest_size;
    return TRUE;
  }
  WARNMS(cinfo, JWRN_JPEG_EOF);
  s->pub.next_input_byte = eoi, s->pub.bytes_in_buffer = 2;
  return TRUE;
}

static void source_skip(j_decompress_ptr cinfo, long n) {
  struct jpeg_source_mgr *s = cinfo->src;
  for (; n > (long)s->bytes_in_buffer; source_fill(cinfo)) n -= (long)s->bytes_in_buffer;
  if (n > 0) s->next_input_byte += n, s->bytes_in_buffer -= (size_t)n;
}

static void source_term(j_decompress_ptr cinfo) { (void)cinfo; }

/*
 * Sets *at to start at the iMCU row holding output row top - 1 (decoded at m/8; row top may take its chroma
 * from the row above it), when that is past the first: at the entry kept for the JPEG, walked to from the
 * deepest one kept where none is. Leaves it at the JPEG's start where the scan cannot be resumed (and keeps
 * that the JPEG cannot), or without memory.
 */
static void resume_above(const sf_jpeg_source *src, int m, int64_t top, start *at) {
  const uint8_t *data = sf_tensor_data(&src->bytes);
  const size_t size = (size_t)src->bytes.shape[0];
  sf_jpeg_scan scan;
  /* An iMCU row is at least m output rows: above that, nothing to pass over (and the header is not read) */
  if (top <= m || !sf_jpeg_entries_enabled() || !sf_jpeg_scan_open(&scan, data, size)) return;
  const int64_t per = scan.row_height / 8 * m; /* output rows of an iMCU row */
  const int row = (int)((top - 1) / per);
  /* Too little to pass over (small images) pays less than the key and the head cost: about 9 us a photograph,
     libjpeg's skipping of one iMCU row of a 500-pixel-wide one (32 MCUs) about 10 us */
  if (row < 1 || row >= scan.rows || (int64_t)row * scan.mcus_per_row < 32) return;
  uint64_t key;
  if (!sf_jpeg_entries_key(data, size, &key)) return;
  sf_jpeg_entry e = sf_jpeg_scan_first(&scan);
  const int known = sf_jpeg_entries_find(key, size, row, &e);
  if (known < 0) return;
  if (known < row) {
    sf_jpeg_entry *walked = malloc((size_t)(row - known) * sizeof *walked);
    const int rc = walked ? sf_jpeg_scan_walk(&scan, &e, known, row - known, walked) : SF_ENOMEM;
    if (rc == 0) sf_jpeg_entries_add(key, size, known + 1, row - known, walked), e = walked[row - known - 1];
    if (rc == SF_EUNSUPPORTED) sf_jpeg_entries_refuse(key, size);
    free(walked);
    if (rc < 0) return;
  }
  size_t resume = 0;
  const int rc = sf_jpeg_scan_resume(&scan, &e, row, &at->head, &at->head_size, &resume);
  if (rc == SF_EUNSUPPORTED) sf_jpeg_entries_refuse(key, size);
  if (rc < 0) return;
  at->rest = data + resume, at->rest_size = size - resume, at->shift = (int64_t)(row - 1) * per;
}

int sf_jpeg_decode_region(const sf_jpeg_source *src, int m, bool fast, const int64_t rect[4], sf_tensor *out,
                          int64_t *x0, sf_error *error) {
  memset(out, 0, sizeof *out);
  start at = {0};
  resume_above(src, m, rect[0], &at);
  struct jpeg_decompress_struct cinfo;
  jpeg_errors e;
  create_decompress(&cinfo, &e);
  if (setjmp(e.jump)) {
    sf_tensor_clear(out);
    jpeg_destroy_decompress(&cinfo);
    free(at.head);
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt JPEG: %s", e.message);
  }
  two_part_source two_part = {
      .pub = {.init_source = source_init, .fill_input_buffer = source_fill, .skip_input_data = source_skip,
              .resync_to_restart = jpeg_resync_to_restart, .term_source = source_term,
              .next_input_byte = at.head, .bytes_in_buffer = at.head_size},
      .at = &at};
  if (at.head)
    cinfo.src = &two_part.pub;
  else
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
  int64_t sw = cinfo.output_width, sh = cinfo.output_height + at.shift;
  if (rect[0] < 0 || rect[2] > sh || rect[0] >= rect[2] || rect[1] < 0 || rect[3] > sw || rect[1] >= rect[3])
    longjmp(e.jump, (snprintf(e.message, sizeof e.message, "region outside the %lldx%lld image", (long long)sw,
                              (long long)sh), 1));
  int64_t top = rect[0] - at.shift, bottom = rect[2] - at.shift;
  /* One more column each side: chroma upsampling replicates the edge column of a cropped region,
     so the rectangle's own edge columns come out as the full decode has them only when inside it. */
  JDIMENSION xoff = (JDIMENSION)(rect[1] > 0 ? rect[1] - 1 : 0);
  JDIMENSION width = (JDIMENSION)(rect[3] < sw ? rect[3] + 1 : sw) - xoff;
  jpeg_crop_scanline(&cinfo, &xoff, &width);
  if (top > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)top) != (JDIMENSION)top)
    longjmp(e.jump, (snprintf(e.message, sizeof e.message, "fewer rows than the header says"), 1));
  if (sf_pixels_alloc(out, SF_DTYPE_UINT8, bottom - top, cinfo.output_width, src->channels) < 0) {
    jpeg_destroy_decompress(&cinfo);
    free(at.head);
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
  free(at.head);
  *x0 = rect[1] - (int64_t)xoff;
  return 0;
}
