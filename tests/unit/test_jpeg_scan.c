/* Unit tests for engine/codec/jpeg_scan.c and jpeg_entries.c: region decodes that start at a kept scan entry give
 * libjpeg's own full decode of the same JPEG, pixel for pixel, for the JPEG layouts entries apply to (4:2:0, 4:2:2,
 * 4:4:4, gray; standard and optimised Huffman tables; odd sizes; DCT scales), and decode as before where they do
 * not (restart markers, progressive) or where the data ends above the region; a JPEG crafted to share another's
 * XXH64 and size does not start at the other's entries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jpeglib.h>

#include "shardflow/log.h"

#include "jpeg_entries.h"
#include "jpeg_region.h"
#include "jpeg_scan.h"

/* How a test JPEG is written: size, components (1 or 3), the luma sampling factors, tables, restarts. */
typedef struct kind {
  const char *name;
  int width, height, components, h, v;
  bool optimize, progressive;
  int restart_rows;
} kind;

/* A photograph-like test image: gradients and smooth waves under noise, so that DC predictors wander. */
static uint8_t *picture(const kind *k) {
  uint8_t *p = malloc((size_t)k->width * (size_t)k->height * (size_t)k->components);
  assert_non_null(p);
  uint32_t x = 2463534242u;
  for (int y = 0; y < k->height; y++)
    for (int i = 0; i < k->width; i++)
      for (int c = 0; c < k->components; c++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        int v = (i * 255 / k->width + y * (c + 1) * 3 + ((i / 7 + y / 5 + c * 3) % 9) * 12) % 256;
        v += (int)(x % 41) - 20;
        v = v < 0 ? 0 : v > 255 ? 255 : v;
        p[((size_t)y * (size_t)k->width + (size_t)i) * (size_t)k->components + (size_t)c] = (uint8_t)v;
      }
  return p;
}

/* Pixels (uint8 [height, width, components]) as a JPEG of kind k at this quality (libjpeg's encoder), in a new
   uint8 [n] tensor. */
static void encode_pixels(const kind *k, const uint8_t *pixels, int quality, sf_tensor *out) {
  struct jpeg_compress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char *mem = NULL;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &mem, &size);
  c.image_width = (JDIMENSION)k->width, c.image_height = (JDIMENSION)k->height;
  c.input_components = k->components;
  c.in_color_space = k->components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  c.comp_info[0].h_samp_factor = k->h, c.comp_info[0].v_samp_factor = k->v;
  c.optimize_coding = k->optimize;
  c.restart_in_rows = k->restart_rows;
  if (k->progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = (JSAMPROW)pixels + (size_t)c.next_scanline * (size_t)k->width * (size_t)k->components;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  assert_int_equal(sf_tensor_alloc(out, SF_DTYPE_UINT8, 1, (int64_t[]){(int64_t)size}), 0);
  memcpy(sf_tensor_data(out), mem, size);
  free(mem);
}

/* The test image of kind k as a JPEG of quality 90. */
static void encode(const kind *k, sf_tensor *out) {
  uint8_t *pixels = picture(k);
  encode_pixels(k, pixels, 90, out);
  free(pixels);
}

/* libjpeg's full decode at scale m/8 (accurate IDCT, fancy upsampling: the region decode's settings). */
static uint8_t *full_decode(const sf_tensor *jpeg, int m, int channels, int *w, int *h) {
  struct jpeg_decompress_struct c;
  struct jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_decompress(&c);
  jpeg_mem_src(&c, sf_tensor_data(jpeg), (unsigned long)jpeg->shape[0]);
  jpeg_read_header(&c, TRUE);
  c.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  c.scale_num = (unsigned)m, c.scale_denom = 8;
  c.dct_method = JDCT_ISLOW, c.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&c);
  *w = (int)c.output_width, *h = (int)c.output_height;
  uint8_t *p = malloc((size_t)*w * (size_t)*h * (size_t)channels);
  assert_non_null(p);
  while (c.output_scanline < c.output_height) {
    JSAMPROW row = p + (size_t)c.output_scanline * (size_t)*w * (size_t)channels;
    jpeg_read_scanlines(&c, &row, 1);
  }
  jpeg_finish_decompress(&c);
  jpeg_destroy_decompress(&c);
  return p;
}

/* Region rect of src decoded at m/8 equals the same rectangle of the full decode `want` (w columns). */
static void check_region(const sf_jpeg_source *src, int m, const int64_t rect[4], const uint8_t *want, int w,
                         const char *name) {
  sf_tensor region;
  int64_t x0 = 0;
  sf_error error;
  int rc = sf_jpeg_decode_region(src, m, false, rect, &region, &x0, &error);
  if (rc != 0) fail_msg("%s m=%d rect %lld..%lld: %s", name, m, (long long)rect[0], (long long)rect[2], error.message);
  const int ch = src->channels;
  const uint8_t *got = sf_tensor_data(&region);
  for (int64_t y = rect[0]; y < rect[2]; y++)
    for (int64_t x = rect[1]; x < rect[3]; x++)
      for (int c = 0; c < ch; c++) {
        uint8_t a = got[((y - rect[0]) * region.shape[1] + x - rect[1] + x0) * ch + c];
        uint8_t b = want[(y * w + x) * ch + c];
        if (a != b)
          fail_msg("%s m=%d rect [%lld,%lld)x[%lld,%lld): pixel (%lld,%lld,%d) is %d, the full decode's %d", name, m,
                   (long long)rect[0], (long long)rect[2], (long long)rect[1], (long long)rect[3], (long long)y,
                   (long long)x, c, a, b);
      }
  sf_tensor_clear(&region);
}

static uint32_t next(uint32_t *x) { return *x = *x * 1103515245u + 12345u, *x >> 8; }

/* The output rows of one iMCU row of k decoded at m/8. */
static int imcu_rows(const kind *k, int m) { return 8 * k->v * m / 8; }

/*
 * Every test rectangle of k (tops at iMCU row edges, one past them, at 0, near the bottom; random ones) decoded
 * twice at each DCT scale (the first walks the scan, the second starts at the kept entries), both equal to the full
 * decode. Returns the deepest row kept.
 */
static int check_kind(const kind *k) {
  sf_tensor jpeg;
  encode(k, &jpeg);
  sf_jpeg_source src;
  const sf_image_mode mode = k->components == 1 ? SF_IMAGE_GRAY : SF_IMAGE_RGB;
  if (!sf_jpeg_probe(&jpeg, mode, NULL, &src)) { /* progressive: region decodes do not take it */
    assert_true(k->progressive);
    sf_tensor_clear(&jpeg);
    return 0;
  }
  uint32_t seed = 7;
  for (int m = 8; m >= 2; m /= 2) {
    int w, h;
    uint8_t *want = full_decode(&jpeg, m, src.channels, &w, &h);
    const int per = imcu_rows(k, m);
    int64_t tops[24];
    int n = 0;
    tops[n++] = 0, tops[n++] = 1, tops[n++] = per, tops[n++] = per + 1, tops[n++] = 2 * per, tops[n++] = 3 * per + 1;
    tops[n++] = h - 2, tops[n++] = h - 1;
    while (n < 24)
      tops[n++] = (int64_t)(next(&seed) % (uint32_t)h);
    for (int i = 0; i < n; i++) {
      if (tops[i] < 0 || tops[i] >= h) continue;
      int64_t bottom = tops[i] + 1 + (int64_t)(next(&seed) % (uint32_t)(h - tops[i]));
      int64_t left = (int64_t)(next(&seed) % (uint32_t)w),
              right = left + 1 + (int64_t)(next(&seed) % (uint32_t)(w - left));
      const int64_t rect[4] = {tops[i], left, bottom, right};
      check_region(&src, m, rect, want, w, k->name);
      check_region(&src, m, rect, want, w, k->name);
    }
    free(want);
  }
  sf_jpeg_entry e;
  uint64_t key;
  assert_true(sf_jpeg_entries_key(sf_tensor_data(&jpeg), (size_t)jpeg.shape[0], &key));
  const int kept = sf_jpeg_entries_find(key, (size_t)jpeg.shape[0], 1 << 20, &e);
  sf_tensor_clear(&src.bytes);
  sf_tensor_clear(&jpeg);
  return kept;
}

/* XXH64's constants and lane round (xxHash's doc/xxhash_spec.md): what crafting a collision needs. */
static const uint64_t XXH_P1 = 0x9E3779B185EBCA87ull, XXH_P2 = 0xC2B2AE3D27D4EB4Full;

static uint64_t lane_at(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

static void put_lane(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++, v >>= 8)
    p[i] = (uint8_t)v;
}

static uint64_t lane_round(uint64_t acc, uint64_t lane) {
  acc += lane * XXH_P2;
  return (acc << 31 | acc >> 33) * XXH_P1;
}

/* XXH64's four accumulators (seed 0) after the 32-byte stripes that start before `end`. Equal accumulators and
   equal bytes after them give equal hashes. */
static void accumulators(const uint8_t *data, size_t end, uint64_t v[4]) {
  v[0] = XXH_P1 + XXH_P2, v[1] = XXH_P2, v[2] = 0, v[3] = -XXH_P1;
  for (size_t p = 0; p + 32 <= end; p += 32)
    for (int i = 0; i < 4; i++)
      v[i] = lane_round(v[i], lane_at(data + p + 8 * i));
}

/* Region rect of jpeg at scale 1 with entries on or off, into *out (0 or the decode's error). */
static int region_of(const sf_tensor *jpeg, bool entries, const int64_t rect[4], sf_tensor *out) {
  sf_jpeg_source src;
  assert_true(sf_jpeg_probe(jpeg, SF_IMAGE_RGB, NULL, &src));
  sf_jpeg_entries_enable(entries);
  int64_t x0;
  sf_error error;
  const int rc = sf_jpeg_decode_region(&src, 8, false, rect, out, &x0, &error);
  sf_jpeg_entries_enable(true);
  sf_tensor_clear(&src.bytes);
  return rc;
}

/*
 * Dataset bytes are anyone's: B is A with 16 bytes of its scan changed, the second 8 chosen (XXH64's lane round is
 * a bijection in its input) so that XXH64's accumulators meet again: the same size and XXH64 as A. Decoded after
 * A's region was (its entries kept), B's region must still be B's own.
 */
static void test_crafted_collision(void **state) {
  (void)state;
  const kind k = {"4:2:0 500x375", 500, 375, 3, 2, 2, false, false, 0};
  sf_tensor a, b;
  encode(&k, &a);
  const size_t n = (size_t)a.shape[0];
  const uint8_t *pa = sf_tensor_data(&a);
  sf_jpeg_scan s;
  assert_int_equal(sf_jpeg_scan_open(&s, pa, n), 1);
  assert_int_equal(sf_tensor_alloc(&b, SF_DTYPE_UINT8, 1, (int64_t[]){(int64_t)n}), 0);
  uint8_t *pb = sf_tensor_data(&b);
  const int64_t rect[4] = {300, 0, 375, 500}; /* rows far below the changed bytes */
  bool crafted = false;
  for (size_t at = (s.scan_start + 2000) & ~(size_t)31; !crafted && at + 80 < n / 2; at += 32 * 7) {
    memcpy(pb, pa, n);
    for (int i = 0; i < 8; i++)
      pb[at + i] ^= (uint8_t)(0x15 * (i + 1)) & 0x7E;
    uint64_t v[4];
    accumulators(pa, at, v);
    const uint64_t via_a = lane_round(v[0], lane_at(pa + at)), via_b = lane_round(v[0], lane_at(pb + at));
    uint64_t inverse = XXH_P2; /* of P2 mod 2^64, by Newton's iteration */
    for (int i = 0; i < 6; i++)
      inverse *= 2 - XXH_P2 * inverse;
    put_lane(pb + at + 32, lane_at(pa + at + 32) + (via_a - via_b) * inverse);
    bool marker = false; /* no 0xFF made or changed, nothing after one: the scan holds no new marker */
    for (size_t i = at - 1; i < at + 40; i++)
      marker |= pa[i] == 0xFF || pb[i] == 0xFF;
    sf_tensor own;
    if (marker || region_of(&b, false, rect, &own) != 0) continue;
    uint64_t va[4], vb[4];
    accumulators(pa, n, va);
    accumulators(pb, n, vb);
    assert_memory_equal(va, vb, sizeof va); /* with the bytes past the last stripe equal: XXH64 equal */
    assert_memory_not_equal(pa, pb, n);
    crafted = true;
    sf_jpeg_entries_reset(SF_JPEG_ENTRY_BUDGET);
    sf_tensor first, second;
    assert_int_equal(region_of(&a, true, rect, &first), 0); /* A walked, its entries kept */
    assert_int_equal(region_of(&b, true, rect, &second), 0);
    assert_int_equal(sf_tensor_nbytes(&second), sf_tensor_nbytes(&own));
    if (memcmp(sf_tensor_data(&second), sf_tensor_data(&own), sf_tensor_nbytes(&own)))
      fail_msg("B's region started at A's entries: XXH64 and size collided (changed bytes at %zu)", at);
    sf_tensor_clear(&first);
    sf_tensor_clear(&second);
    sf_tensor_clear(&own);
  }
  assert_true(crafted);
  sf_tensor_clear(&b);
  sf_tensor_clear(&a);
}

static void test_regions_equal_full_decode(void **state) {
  (void)state;
  sf_jpeg_entries_reset(SF_JPEG_ENTRY_BUDGET);
  const kind kinds[] = {
      {"4:2:0 500x375", 500, 375, 3, 2, 2, false, false, 0},
      {"4:2:0 optimised tables 333x517", 333, 517, 3, 2, 2, true, false, 0},
      {"4:2:2 301x199", 301, 199, 3, 2, 1, false, false, 0},
      {"4:4:4 256x160", 256, 160, 3, 1, 1, true, false, 0},
      {"gray 211x300", 211, 300, 1, 1, 1, false, false, 0},
  };
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    const int kept = check_kind(&kinds[i]);
    /* the tops below the first iMCU rows started at kept entries, walked to the deepest of them */
    if (kept < 2) fail_msg("%s: %d rows of entries kept", kinds[i].name, kept);
  }
  /* Noise in every block: the optimised DC table has no code for differences 0 and 1, so no stand-in row can be
     written in its codes; the JPEG is refused on its first region, and its regions decode as before */
  const kind noisy = {"gray optimised tables 64x401", 64, 401, 1, 1, 1, true, false, 0};
  assert_int_equal(check_kind(&noisy), -1);
}

/* Log lines that say the entries' budget is full. */
static void count_full(void *opaque, int level, const char *stage, const char *message) {
  (void)level, (void)stage;
  if (strstr(message, "budget is full")) ++*(int *)opaque;
}

static void test_others_decode_as_before(void **state) {
  (void)state;
  sf_jpeg_entries_reset(SF_JPEG_ENTRY_BUDGET);
  const kind restarts = {"4:2:0 restart markers", 240, 320, 3, 2, 2, false, false, 1};
  const kind progressive = {"progressive", 240, 320, 3, 2, 2, false, true, 0};
  assert_int_equal(check_kind(&restarts), 0); /* not walked: the pixels are libjpeg's skip's */
  assert_int_equal(check_kind(&progressive), 0);
  /* With no budget nothing is kept, and every decode walks: the pixels are the same; the log says so once */
  sf_jpeg_entries_reset(0);
  int full = 0;
  assert_int_equal(sf_log_set_handler(count_full, &full), 0);
  const kind plain = {"4:2:0 no budget", 200, 300, 3, 2, 2, false, false, 0};
  assert_int_equal(check_kind(&plain), 0);
  assert_int_equal(sf_log_set_handler(NULL, NULL), 0);
  assert_int_equal(full, 1);
  sf_jpeg_entries_reset(SF_JPEG_ENTRY_BUDGET);
}

/* A JPEG whose scan ends above the region (cut, then its EOI): the walk stops, the JPEG is refused, libjpeg reports
   the end. Cut without the EOI, it is not walked at all (sf_jpeg_scan_open wants one last). */
static void test_truncated_above_region(void **state) {
  (void)state;
  sf_jpeg_entries_reset(SF_JPEG_ENTRY_BUDGET);
  const kind k = {"4:2:0 truncated", 320, 480, 3, 2, 2, false, false, 0};
  sf_tensor whole, cut;
  encode(&k, &whole);
  const int64_t n = whole.shape[0] * 2 / 5 + 2;
  assert_int_equal(sf_tensor_alloc(&cut, SF_DTYPE_UINT8, 1, (int64_t[]){n}), 0);
  memcpy(sf_tensor_data(&cut), sf_tensor_data(&whole), (size_t)n - 2);
  uint8_t *end = (uint8_t *)sf_tensor_data(&cut) + n - 2;
  end[0] = 0xFF, end[1] = 0xD9;
  sf_jpeg_scan s;
  assert_int_equal(sf_jpeg_scan_open(&s, sf_tensor_data(&cut), (size_t)n), 1);
  assert_int_equal(sf_jpeg_scan_open(&s, sf_tensor_data(&cut), (size_t)n - 2), 0);
  sf_jpeg_source src;
  assert_true(sf_jpeg_probe(&cut, SF_IMAGE_RGB, NULL, &src));
  const int64_t rect[4] = {400, 10, 470, 300};
  sf_tensor region;
  int64_t x0;
  sf_error error;
  for (int i = 0; i < 2; i++)
    assert_int_equal(sf_jpeg_decode_region(&src, 8, false, rect, &region, &x0, &error), SF_EFORMAT);
  sf_jpeg_entry e;
  uint64_t key;
  assert_true(sf_jpeg_entries_key(sf_tensor_data(&cut), (size_t)n, &key));
  assert_int_equal(sf_jpeg_entries_find(key, (size_t)n, 30, &e), -1);
  sf_tensor_clear(&src.bytes);
  sf_tensor_clear(&cut);
  sf_tensor_clear(&whole);
}

/*
 * A scan resumed inside a data byte 0xFF (its stuffed zero follows it in the original): the head ends with that
 * byte joined to the stand-in's last bits, and the rows from there decode as libjpeg's full decode has them.
 * Heavy noise at quality 95 puts some iMCU rows' starts inside one (with the standard tables' two-bit chroma end
 * of block before them, photographs rarely do).
 */
static void test_resume_inside_0xff(void **state) {
  (void)state;
  const int w = 154, h = 74;
  uint8_t *px = malloc((size_t)w * h * 3);
  assert_non_null(px);
  uint32_t x = 58 * 2654435761u;
  for (int i = 0; i < w * h * 3; i++)
    x ^= x << 13, x ^= x >> 17, x ^= x << 5, px[i] = (uint8_t)((i / 3 % w) * 3 + (int)(x % 97));
  const kind k = {"4:2:0 noise", w, h, 3, 2, 2, false, false, 0};
  sf_tensor jpeg;
  encode_pixels(&k, px, 95, &jpeg);
  free(px);
  const size_t size = (size_t)jpeg.shape[0];
  const uint8_t *data = sf_tensor_data(&jpeg);
  sf_jpeg_scan s;
  assert_int_equal(sf_jpeg_scan_open(&s, data, size), 1);
  sf_jpeg_entry e[16];
  e[0] = sf_jpeg_scan_first(&s);
  assert_true(s.rows <= 16);
  assert_int_equal(sf_jpeg_scan_walk(&s, &e[0], 0, s.rows - 1, e + 1), 0);
  int row = 1;
  while (row < s.rows && !(data[e[row].byte] == 0xFF && e[row].bit > 0))
    row++;
  assert_true(row < s.rows); /* the case this test is for */
  uint8_t *head;
  size_t head_size, resume;
  assert_int_equal(sf_jpeg_scan_resume(&s, &e[row], row, &head, &head_size, &resume), 0);
  assert_int_equal(resume, e[row].byte + 2); /* past the 0xFF and its stuffed zero */
  sf_tensor joined;
  assert_int_equal(sf_tensor_alloc(&joined, SF_DTYPE_UINT8, 1, (int64_t[]){(int64_t)(head_size + size - resume)}), 0);
  memcpy(sf_tensor_data(&joined), head, head_size);
  memcpy((uint8_t *)sf_tensor_data(&joined) + head_size, data + resume, size - resume);
  free(head);
  int fw, fh, jw, jh;
  uint8_t *want = full_decode(&jpeg, 8, 3, &fw, &fh), *got = full_decode(&joined, 8, 3, &jw, &jh);
  const int shift = (row - 1) * s.row_height;
  assert_int_equal(jh, fh - shift);
  for (int y = row * s.row_height + 1; y < fh; y++)
    if (memcmp(want + (size_t)y * fw * 3, got + (size_t)(y - shift) * jw * 3, (size_t)fw * 3))
      fail_msg("row %d differs after resuming inside a 0xFF byte at iMCU row %d", y, row);
  free(want);
  free(got);
  sf_tensor_clear(&joined);
  sf_tensor_clear(&jpeg);
}

/* Walking rows in pieces gives the entries of walking them at once. */
static void test_walk_in_pieces(void **state) {
  (void)state;
  const kind k = {"4:2:0", 500, 375, 3, 2, 2, false, false, 0};
  sf_tensor jpeg;
  encode(&k, &jpeg);
  sf_jpeg_scan s;
  assert_int_equal(sf_jpeg_scan_open(&s, sf_tensor_data(&jpeg), (size_t)jpeg.shape[0]), 1);
  assert_int_equal(s.rows, 24);
  assert_int_equal(s.mcus_per_row, 32);
  assert_int_equal(s.blocks, 6);
  sf_jpeg_entry whole[23], piece[23];
  const sf_jpeg_entry first = sf_jpeg_scan_first(&s);
  assert_int_equal(sf_jpeg_scan_walk(&s, &first, 0, 23, whole), 0);
  assert_int_equal(sf_jpeg_scan_walk(&s, &first, 0, 5, piece), 0);
  assert_int_equal(sf_jpeg_scan_walk(&s, &piece[4], 5, 18, piece + 5), 0);
  bool bits_vary = false;
  for (int i = 0; i < 23; i++) {
    assert_int_equal(whole[i].byte, piece[i].byte);
    assert_int_equal(whole[i].bit, piece[i].bit);
    for (int c = 0; c < 3; c++)
      assert_int_equal(whole[i].dc[c], piece[i].dc[c]);
    if (i > 0) assert_true(whole[i].byte > whole[i - 1].byte);
    bits_vary |= whole[i].bit != whole[0].bit;
  }
  assert_true(bits_vary);
  assert_int_equal(sf_jpeg_scan_walk(&s, &first, 0, 24, whole), SF_EINVAL); /* past the last row */
  sf_tensor_clear(&jpeg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_crafted_collision),
      cmocka_unit_test(test_walk_in_pieces),
      cmocka_unit_test(test_resume_inside_0xff),
      cmocka_unit_test(test_regions_equal_full_decode),
      cmocka_unit_test(test_others_decode_as_before),
      cmocka_unit_test(test_truncated_above_region),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
