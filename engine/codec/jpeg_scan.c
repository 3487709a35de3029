/* Entry points into a baseline JPEG's scan (ITU-T T.81 Annexes B, C and F.2): see jpeg_scan.h. */
#include "jpeg_scan.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/error.h"

static unsigned be16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

/*
 * A table's codes (T.81 Annex C: canonical, shortest first, in the order of the symbols), into code/length.
 * Returns false where libjpeg refuses the table (jpeg_make_d_derived_tbl): more codes than a length has
 * room for, more than 256 symbols, a DC symbol above 15.
 */
static bool make_codes(const uint8_t *t, size_t room, bool dc, uint16_t *code, uint8_t *length) {
  if (room < 16) return false;
  unsigned total = 0;
  for (int i = 0; i < 16; i++)
    total += t[i];
  if (total > 256 || room < 16 + total) return false;
  const uint8_t *values = t + 16;
  memset(length, 0, 256);
  uint32_t c = 0;
  for (unsigned len = 1, k = 0; len <= 16; len++, c <<= 1) {
    for (unsigned i = 0; i < t[len - 1]; i++, k++, c++) {
      if (dc && values[k] > 15) return false;
      code[values[k]] = (uint16_t)c, length[values[k]] = (uint8_t)len;
    }
    if (c >= (1u << len) && t[len - 1]) return false; /* the all-ones code is not one either */
  }
  return true;
}

/* Reads one marker segment's worth of a frame header (SOF0/SOF1) into s. */
static bool read_frame(sf_jpeg_scan *s, const uint8_t *p, unsigned len, size_t at, uint8_t ids[3], uint8_t hv[3]) {
  if (len < 8 || p[2] != 8) return false; /* 8-bit samples only */
  s->height = (int)be16(p + 3), s->width = (int)be16(p + 5), s->height_at = at + 3;
  int n = p[7];
  if (s->height == 0 || s->width == 0 || (n != 1 && n != 3) || len != 8u + 3u * (unsigned)n) return false;
  s->components = n;
  for (int c = 0; c < n; c++)
    ids[c] = p[8 + 3 * c], hv[c] = p[9 + 3 * c];
  return true;
}

/* The sampling factors and MCU layout of the scan whose components are ids[order[c]] (frame factors hv). */
static bool layout(sf_jpeg_scan *s, const uint8_t order[3], const uint8_t hv[3]) {
  int hmax = 1, vmax = 1, b = 0;
  for (int f = 0; f < s->components; f++) {
    int h = hv[f] >> 4, v = hv[f] & 15;
    bool ok = s->components == 1 ? h == 1 && v == 1 : f == 0 ? h >= 1 && h <= 2 && v >= 1 && v <= 2 : h == 1 && v == 1;
    if (!ok) return false;
    hmax = h > hmax ? h : hmax, vmax = v > vmax ? v : vmax;
  }
  for (int c = 0; c < s->components; c++) {
    int f = order[c], blocks = (hv[f] >> 4) * (hv[f] & 15);
    for (int i = 0; i < blocks; i++)
      s->block_component[b++] = (uint8_t)c;
  }
  s->blocks = b;
  s->row_height = 8 * vmax;
  s->mcus_per_row = (s->width + 8 * hmax - 1) / (8 * hmax);
  s->rows = (s->height + s->row_height - 1) / s->row_height;
  return true;
}

/* The scan header: every frame component once, interleaved, the whole spectrum, no successive approximation. */
static bool read_scan(sf_jpeg_scan *s, const uint8_t *p, unsigned len, const uint8_t ids[3], const uint8_t hv[3]) {
  int n = len >= 3 ? p[2] : 0;
  if (n != s->components || len != 6u + 2u * (unsigned)n) return false;
  uint8_t order[3], seen = 0;
  for (int c = 0; c < n; c++) {
    int f = 0;
    while (f < n && ids[f] != p[3 + 2 * c])
      f++;
    if (f == n || (seen >> f & 1)) return false;
    seen |= (uint8_t)(1 << f), order[c] = (uint8_t)f;
    s->dc_table[c] = p[4 + 2 * c] >> 4, s->ac_table[c] = 4 + (p[4 + 2 * c] & 15);
    if (s->dc_table[c] > 3 || s->ac_table[c] > 7 || !s->table[s->dc_table[c]] || !s->table[s->ac_table[c]])
      return false;
  }
  const uint8_t *q = p + 3 + 2 * n;
  return q[0] == 0 && q[1] == 63 && q[2] == 0 && layout(s, order, hv);
}

int sf_jpeg_scan_open(sf_jpeg_scan *s, const uint8_t *data, size_t size) {
  memset(s, 0, offsetof(sf_jpeg_scan, code));
  s->segments = 0;
  s->data = data, s->size = size;
  /* An EOI last: where a resumed decode reads ahead past the scan's last bits, it meets that marker, as a
     decode from the start does (without it, the two may read a few bytes further than the data, differently) */
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8 || data[size - 2] != 0xFF || data[size - 1] != 0xD9) return 0;
  uint8_t ids[3] = {0}, hv[3] = {0};
  bool frame = false;
  for (size_t at = 2;;) {
    if (at >= size || data[at] != 0xFF) return 0; /* stray bytes: libjpeg warns, which is an error here */
    while (at + 1 < size && data[at + 1] == 0xFF)
      at++;
    if (at + 4 > size) return 0;
    const unsigned marker = data[at + 1], len = be16(data + at + 2);
    const size_t end = at + 2 + len;
    if (len < 2 || end > size || marker < 0xC0 || (marker >= 0xD0 && marker <= 0xD9)) return 0;
    const uint8_t *p = data + at + 2;
    if (marker == 0xC0 || marker == 0xC1) {
      if (frame || !read_frame(s, p, len, at + 2, ids, hv)) return 0;
      frame = true;
    } else if (marker == 0xC4) {
      for (size_t q = 2; q < len;) { /* one or more tables: class and id, 16 counts, the symbols */
        const unsigned tc = p[q] >> 4, th = p[q] & 15;
        if (tc > 1 || th > 3) return 0;
        const int id = (int)(tc * 4 + th);
        if (!make_codes(p + q + 1, len - q - 1, tc == 0, s->code[id], s->length[id])) return 0;
        s->table[id] = p + q + 1;
        size_t symbols = 0;
        for (int i = 0; i < 16; i++)
          symbols += p[q + 1 + i];
        q += 17 + symbols;
      }
    } else if (marker == 0xDD) {
      if (len != 4 || be16(p + 2) != 0) return 0; /* restart markers: not walked */
    } else if (marker == 0xDA) {
      if (!frame || !read_scan(s, p, len, ids, hv)) return 0;
    } else if ((marker >= 0xC2 && marker <= 0xCF) || marker == 0xDC || marker == 0xDE || marker == 0xDF) {
      return 0; /* progressive, lossless, arithmetic coding, hierarchical, DNL */
    }
    /* Dropped from the head: application segments other than JFIF's and Adobe's, comments. */
    bool keep = !((marker >= 0xE1 && marker <= 0xED) || marker == 0xEF || marker == 0xFE);
    if (keep) {
      if (s->segments == SF_JPEG_SCAN_MAX_SEGMENTS) return 0;
      s->segment[s->segments][0] = (uint32_t)at, s->segment[s->segments][1] = (uint32_t)end;
      s->segments++;
    }
    if (marker == 0xDA) {
      s->scan_start = end;
      return end < size && size <= UINT32_MAX;
    }
    at = end;
  }
}

sf_jpeg_entry sf_jpeg_scan_first(const sf_jpeg_scan *s) { return (sf_jpeg_entry){.byte = (uint32_t)s->scan_start}; }

/* ---- walking: Annex F.2.2's decoding, keeping only the DC predictors ---- */

enum { LOOK = 10 }; /* bits of the lookahead tables */

typedef struct decoder {
  uint16_t fast[1 << LOOK]; /* by the next LOOK bits: code length << 8 | symbol; 0 when the code is longer */
  uint16_t skip[1 << LOOK]; /* AC: bits a coefficient takes (code and magnitude, low 5 bits) and how far the
                               index moves (bits 5-11, 0 = end of block); 0 when they are more than LOOK */
  int32_t maxcode[18];      /* the largest code of each length, -1 when none (F.2.2.3) */
  int32_t valoff[17];       /* symbol index of a code of each length, less the code */
  const uint8_t *values;
} decoder;

static void make_decoder(decoder *d, const uint8_t *t, bool ac) {
  memset(d->fast, 0, sizeof d->fast);
  memset(d->skip, 0, sizeof d->skip);
  d->values = t + 16;
  int32_t c = 0;
  for (int len = 1, k = 0; len <= 16; len++, c <<= 1) {
    const int n = t[len - 1];
    d->valoff[len] = k - c, d->maxcode[len] = n ? c + n - 1 : -1;
    for (int i = 0; i < n; i++, k++, c++) {
      if (len > LOOK) continue;
      const uint8_t sym = d->values[k];
      const int r = sym >> 4, size = sym & 15, total = len + size;
      const uint16_t skip = total > LOOK ? 0 : (uint16_t)(total | (size ? r + 1 : r == 15 ? 16 : 0) << 5);
      for (int j = 0; j < 1 << (LOOK - len); j++) {
        d->fast[(c << (LOOK - len)) + j] = (uint16_t)(len << 8 | sym);
        if (ac) d->skip[(c << (LOOK - len)) + j] = skip;
      }
    }
  }
  d->maxcode[17] = INT32_MAX;
}

/*
 * The scan's bits: `bits` holds n of them, the next one its top bit. Stuffed zero bytes are dropped; at a
 * marker or the end of the data, zero bytes are made up (as libjpeg does), counted in `made`.
 */
typedef struct reader {
  const uint8_t *data;
  size_t at, size;
  uint64_t bits;
  int n, made;
} reader;

/* Bytes one at a time: near the end of the data, at a 0xFF (stuffed, or a marker), after a marker. */
static void fill_bytes(reader *r) {
  while (r->n <= 56) {
    uint8_t b = 0;
    if (!r->made && r->at < r->size) {
      b = r->data[r->at];
      if (b != 0xFF)
        r->at++;
      else if (r->at + 1 < r->size && r->data[r->at + 1] == 0)
        r->at += 2;
      else
        b = 0, r->made++;
    } else {
      r->made++;
    }
    r->bits |= (uint64_t)b << (56 - r->n);
    r->n += 8;
  }
}

/* At least 57 bits in r (the next 8 bytes at once when none of them is 0xFF). Inlined, so that the reader's
   fields stay in registers. */
static inline __attribute__((always_inline)) void fill(reader *r) {
  if (!r->made && r->at + 8 <= r->size) {
    uint64_t v;
    memcpy(&v, r->data + r->at, 8);
    const uint64_t x = ~v; /* a 0xFF byte of v is a zero byte of x */
    if (!((x - 0x0101010101010101ull) & ~x & 0x8080808080808080ull)) {
      const int k = (64 - r->n) / 8;
      r->bits |= (__builtin_bswap64(v) & ~0ull << (64 - 8 * k)) >> r->n;
      r->n += 8 * k, r->at += (size_t)k;
      return;
    }
  }
  fill_bytes(r);
}

static inline void drop(reader *r, int k) { r->bits <<= k, r->n -= k; }

/* The next symbol of d (r holds at least 16 bits), or -1 for a code d lacks. */
static inline int decode(reader *r, const decoder *d) {
  const uint16_t e = d->fast[r->bits >> (64 - LOOK)];
  if (e) {
    drop(r, e >> 8);
    return e & 0xFF;
  }
  for (int len = LOOK + 1; len <= 16; len++) {
    const int32_t c = (int32_t)(r->bits >> (64 - len));
    if (c <= d->maxcode[len]) {
      drop(r, len);
      return d->values[(d->valoff[len] + c) & 0xFF];
    }
  }
  return -1;
}

/* One block's 63 AC coefficients passed over. Returns false for a code d lacks. */
static inline bool skip_ac(reader *r, const decoder *d) {
  for (int k = 1; k < 64;) {
    if (r->n < 32) fill(r);
    const uint16_t e = d->skip[r->bits >> (64 - LOOK)];
    if (e) {
      drop(r, e & 31);
      if (!(e >> 5)) return true;
      k += e >> 5;
      continue;
    }
    const int sym = decode(r, d);
    if (sym < 0) return false;
    const int run = sym >> 4, size = sym & 15;
    if (size) {
      drop(r, size);
      k += run + 1;
    } else if (run == 15) {
      k += 16;
    } else {
      return true;
    }
  }
  return true;
}

/* One MCU passed over, its DC differences added to dc. Returns false where it cannot be walked. */
static bool skip_mcu(const sf_jpeg_scan *s, reader *r, const decoder *dcd[], const decoder *acd[], int32_t dc[]) {
  for (int b = 0; b < s->blocks; b++) {
    const int c = s->block_component[b];
    if (r->n < 32) fill(r);
    const int size = decode(r, dcd[c]);
    if (size < 0) return false;
    if (size) {
      if (r->n < 16) fill(r);
      int32_t v = (int32_t)(r->bits >> (64 - size));
      drop(r, size);
      dc[c] += v < (1 << (size - 1)) ? v - (1 << size) + 1 : v; /* F.2.2.1's EXTEND */
    }
    if (!skip_ac(r, acd[c])) return false;
  }
  return true;
}

/* Where the next bit is, as an entry with the predictors dc; false when it is in made-up bytes. The bytes
   loaded and not yet used are walked back over from r->at, a stuffed zero with its 0xFF (F.1.2.3). */
static bool here(const reader *r, const int32_t dc[], int components, sf_jpeg_entry *e) {
  const int real = r->n - 8 * r->made;
  if (real <= 0) return false;
  size_t p = r->at;
  for (int i = 0; i < (real + 7) / 8; i++)
    p -= p >= 2 && r->data[p - 1] == 0 && r->data[p - 2] == 0xFF ? 2 : 1;
  *e = (sf_jpeg_entry){.byte = (uint32_t)p, .bit = (uint8_t)((8 - real % 8) & 7)};
  for (int c = 0; c < components; c++) {
    if (dc[c] < INT16_MIN || dc[c] > INT16_MAX) return false;
    e->dc[c] = (int16_t)dc[c];
  }
  return true;
}

int sf_jpeg_scan_walk(const sf_jpeg_scan *s, const sf_jpeg_entry *at, int row, int n, sf_jpeg_entry *out) {
  if (row < 0 || n < 1 || row + n >= s->rows || at->byte < s->scan_start || at->byte >= s->size || at->bit > 7)
    return SF_EINVAL;
  decoder *tables = malloc(8 * sizeof *tables);
  if (!tables) return SF_ENOMEM;
  const decoder *dcd[SF_JPEG_SCAN_MAX_COMPONENTS], *acd[SF_JPEG_SCAN_MAX_COMPONENTS];
  uint8_t made = 0;
  for (int c = 0; c < s->components; c++) {
    const int t[2] = {s->dc_table[c], s->ac_table[c]};
    for (int i = 0; i < 2; i++)
      if (!(made >> t[i] & 1)) make_decoder(&tables[t[i]], s->table[t[i]], i == 1), made |= (uint8_t)(1 << t[i]);
    dcd[c] = &tables[t[0]], acd[c] = &tables[t[1]];
  }
  reader r = {.data = s->data, .at = at->byte, .size = s->size};
  fill(&r);
  drop(&r, at->bit);
  int32_t dc[SF_JPEG_SCAN_MAX_COMPONENTS] = {0};
  for (int c = 0; c < s->components; c++)
    dc[c] = at->dc[c];
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    for (int m = 0; m < s->mcus_per_row && rc == 0; m++)
      if (!skip_mcu(s, &r, dcd, acd, dc)) rc = SF_EUNSUPPORTED;
    if (rc == 0 && !here(&r, dc, s->components, &out[i])) rc = SF_EUNSUPPORTED;
  }
  free(tables);
  return rc;
}

/* ---- resuming: a stand-in row in the original's codes, then its bytes ---- */

/* Bits written most significant first, a zero byte stuffed after each 0xFF (F.1.2.3). */
typedef struct writer {
  uint8_t *p;
  uint64_t acc;
  int n; /* bits in acc not yet written */
} writer;

static void put(writer *w, uint32_t v, int len) {
  w->acc = w->acc << len | (v & ((1u << len) - 1)), w->n += len;
  for (; w->n >= 8; w->n -= 8) {
    const uint8_t b = (uint8_t)(w->acc >> (w->n - 8));
    *w->p++ = b;
    if (b == 0xFF) *w->p++ = 0;
  }
}

/* F.1.2.1's category (magnitude bits) of a DC difference or AC value. */
static int category(int32_t v) {
  int n = 0;
  for (uint32_t a = (uint32_t)(v < 0 ? -v : v); a; a >>= 1)
    n++;
  return n;
}

/* The fewest AC coefficients of sizes the table codes (run 0) whose bits add up to `need` modulo 8: their
   sizes in size[] (up to 7), their count returned; -1 when no such set exists. */
static int padding(const uint8_t *length, int need, int size[7]) {
  int from[8], via[8];
  for (int i = 0; i < 8; i++)
    from[i] = -2;
  from[0] = -1;
  int frontier[8] = {0}, n = 1;
  for (int step = 0; step < 7 && from[need] == -2; step++) {
    int next[8], m = 0;
    for (int i = 0; i < n; i++)
      for (int sz = 1; sz <= 10; sz++) {
        if (!length[sz]) continue;
        const int to = (frontier[i] + length[sz] + sz) % 8;
        if (from[to] == -2) from[to] = frontier[i], via[to] = sz, next[m++] = to;
      }
    memcpy(frontier, next, sizeof next), n = m;
  }
  if (from[need] == -2) return -1;
  int count = 0;
  for (int at = need; from[at] != -1; at = from[at])
    size[count++] = via[at];
  return count;
}

/*
 * DC differences with codes in a table (length: 0 where none) that add up to `sum`, at most `most` of them, the
 * largest first; the blocks after them take difference 0. Their count, or -1 when the table cannot.
 */
static int dc_steps(const uint8_t *length, int32_t sum, int most, int32_t *step) {
  int n = 0;
  for (int32_t left = sum; left; n++) {
    const int32_t size = left < 0 ? -left : left;
    int cat = category(size);
    /* the largest category with a code whose smallest value fits */
    while (cat > 0 && !length[cat])
      cat--;
    if (!cat || n == most) return -1;
    const int32_t v = size < (1 << cat) - 1 ? size : (1 << cat) - 1;
    step[n] = left < 0 ? -v : v, left -= step[n];
  }
  return n < most && !length[0] ? -1 : n;
}

/* The stand-in row: every block flat, its component's predictor reached over its first blocks, padded with AC
   coefficients in the first block so that it ends `bit` bits into a byte. Returns 0; SF_EUNSUPPORTED without codes
   for it; SF_ENOMEM. */
static int stand_in(const sf_jpeg_scan *s, const sf_jpeg_entry *at, writer *w) {
  const int nc = s->components;
  int32_t *steps[SF_JPEG_SCAN_MAX_COMPONENTS] = {NULL};
  int n_steps[SF_JPEG_SCAN_MAX_COMPONENTS];
  int64_t bits = 0;
  bool ok = true, memory = true;
  for (int c = 0; c < nc && ok; c++) {
    const uint8_t *dcl = s->length[s->dc_table[c]], *acl = s->length[s->ac_table[c]];
    int blocks = 0;
    for (int b = 0; b < s->blocks; b++)
      blocks += s->block_component[b] == c;
    blocks *= s->mcus_per_row;
    steps[c] = malloc((size_t)blocks * sizeof(int32_t));
    memory = steps[c] != NULL;
    n_steps[c] = memory ? dc_steps(dcl, at->dc[c], blocks, steps[c]) : -1;
    ok = n_steps[c] >= 0 && acl[0x00];
    for (int i = 0; i < n_steps[c] && ok; i++)
      bits += dcl[category(steps[c][i])] + category(steps[c][i]);
    bits += (int64_t)(blocks - (ok ? n_steps[c] : 0)) * dcl[0] + (int64_t)blocks * acl[0x00];
  }
  int size[7], pads = -1;
  const int c0 = s->block_component[0];
  if (ok) pads = padding(s->length[s->ac_table[c0]], (int)((at->bit - bits % 8 + 8) % 8), size);
  if (pads >= 0) {
    int used[SF_JPEG_SCAN_MAX_COMPONENTS] = {0};
    for (int m = 0; m < s->mcus_per_row; m++)
      for (int b = 0; b < s->blocks; b++) {
        const int c = s->block_component[b], dc = s->dc_table[c], ac = s->ac_table[c];
        const int32_t diff = used[c] < n_steps[c] ? steps[c][used[c]] : 0;
        const int cat = category(diff);
        used[c]++;
        put(w, s->code[dc][cat], s->length[dc][cat]);
        if (cat) put(w, (uint32_t)(diff > 0 ? diff : diff + (1 << cat) - 1), cat);
        if (m == 0 && b == 0)
          for (int i = 0; i < pads; i++)
            put(w, s->code[ac][size[i]], s->length[ac][size[i]]), put(w, 1u << (size[i] - 1), size[i]);
        put(w, s->code[ac][0x00], s->length[ac][0x00]);
      }
  }
  for (int c = 0; c < nc; c++)
    free(steps[c]);
  return pads >= 0 ? 0 : memory ? SF_EUNSUPPORTED : SF_ENOMEM;
}

int sf_jpeg_scan_resume(const sf_jpeg_scan *s, const sf_jpeg_entry *at, int row, uint8_t **head, size_t *head_size,
                        size_t *resume) {
  *head = NULL;
  if (row < 1 || row >= s->rows || at->byte < s->scan_start || at->byte >= s->size || at->bit > 7) return SF_EINVAL;
  size_t header = 0;
  for (int i = 0; i < s->segments; i++)
    header += s->segment[i][1] - s->segment[i][0];
  /* a block's DC code and bits, end of block: at most 16 + 15 + 16 bits; the padding 7 x 26; all stuffed */
  const size_t row_bytes = ((size_t)s->mcus_per_row * (size_t)s->blocks * 47 + 7 * 26) / 8 * 2 + 16;
  uint8_t *p = malloc(2 + header + row_bytes + 2);
  if (!p) return SF_ENOMEM;
  p[0] = 0xFF, p[1] = 0xD8;
  size_t n = 2;
  for (int i = 0; i < s->segments; i++) {
    const size_t from = s->segment[i][0], to = s->segment[i][1];
    memcpy(p + n, s->data + from, to - from);
    if (s->height_at > from && s->height_at < to) {
      const unsigned height = (unsigned)(s->height - (row - 1) * s->row_height);
      p[n + s->height_at - from] = (uint8_t)(height >> 8), p[n + s->height_at - from + 1] = (uint8_t)height;
    }
    n += to - from;
  }
  writer w = {.p = p + n};
  const int rc = stand_in(s, at, &w);
  if (rc < 0 || w.n != at->bit) {
    free(p);
    return rc < 0 ? rc : SF_EUNSUPPORTED;
  }
  size_t next = at->byte;
  if (at->bit) { /* the stand-in's last bits, then the rest of the entry's byte */
    const uint8_t original = s->data[at->byte];
    const uint8_t joined = (uint8_t)(w.acc << (8 - w.n) | (original & (0xFF >> at->bit)));
    *w.p++ = joined;
    if (joined == 0xFF) *w.p++ = 0;
    next = at->byte + (original == 0xFF ? 2 : 1); /* the original's stuffed zero goes with its 0xFF */
  }
  *head = p, *head_size = (size_t)(w.p - p), *resume = next;
  return 0;
}
