/* WebDataset samples from a streamed tar shard: gzip/zstd decompressed and checked, libarchive's tar reader, key grouping. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <archive.h>
#include <archive_entry.h>
#include <zlib.h>
#include <zstd.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "parse.h"
#include "tar_reader.h"
#include "tfrecord.h"

/* Most bytes read after the end-of-archive blocks to reach the source's end. */
#define DRAIN_MAX ((int64_t)4 << 20)
/* Decompressed bytes handed to libarchive per read; memory shards go to zlib in pieces this big at most. */
#define OUT_CHUNK ((size_t)256 << 10)
#define MEMORY_CHUNK ((size_t)1 << 30)

struct sf_tar_reader {
  struct archive *archive;
  sf_shard_reader *source;  /* NULL when reading from memory */
  const void *memory;
  size_t memory_size;
  size_t memory_pos;
  /* The first raw chunk, read to look for a compressor's magic and not yet handed on. */
  bool has_first;
  const void *first;
  ssize_t first_size;
  /*
   * A .tar.gz or .tar.zst is decompressed here, not by libarchive's filters:
   * they stop at the tar's end-of-archive blocks, before gzip's CRC-32 and
   * length or zstd's checksum, which then go unchecked.
   */
  z_stream *gzip;           /* set when the shard starts with gzip's magic */
  ZSTD_DStream *zstd;       /* set when it starts with zstd's */
  uint8_t *out;             /* OUT_CHUNK decompressed bytes */
  const uint8_t *in;        /* raw bytes not yet decompressed */
  size_t in_size;
  bool raw_done;            /* the raw source said end */
  bool frame_end;           /* the last gzip member or zstd frame ended, its check passed */
  int codec_failed;         /* the decompressor's error, held back while the bytes before it are read */
  sf_buffer *url;           /* NUL-terminated, shared by every sample */
  const char *url_text;
  int source_code;          /* the shard reader's failure, if libarchive saw one */
  sf_error source_error;
  int failed;               /* sticky: after a fatal error every call returns it */
  sf_error fatal;
  bool eof;
  bool drained;             /* the source was read to its end after the archive's end */
  uint64_t index;           /* samples returned so far */
  /* One member of lookahead: its header is read, its data not yet. */
  bool pending;
  char *path;               /* member path, the field part lower-cased */
  size_t path_capacity;
  size_t key_len;           /* key = path[0, key_len) */
  const char *field;        /* points into path */
  int64_t size;
  bool sparse;
  int64_t offset;           /* header position in the (decompressed) tar stream */
  int64_t end_offset;       /* where the end-of-archive blocks start, once eof is set */
  int64_t sample_size;      /* bytes of the sample being read */
  int64_t max_member_size, max_sample_size; /* see sf_tar_reader_set_limits() */
  int64_t largest_span;     /* stream bytes of the largest sample so far, header to next header */
  char last_key[sizeof(sf_error){0}.key]; /* for messages (cut short like every error's key) */
  sf_key_rule key_rule;     /* see sf_tar_reader_set_key_rule() */
  const regex_t *key_regex; /* borrowed */
  /*
   * Plain ustar members (see plain_header) are parsed here: libarchive spends more per member than
   * the CIFAR pipeline spends on tar otherwise (a wide-character copy of each name, a sparse list, a
   * copy of the bytes through its own buffer). At the first other header (pax, GNU, links, end
   * blocks, damage) libarchive takes over for the rest of the shard; archive is NULL until then.
   */
  bool fast;
  const uint8_t *chunk;     /* the stream chunk the fast path reads (borrowed, see read_stream) */
  size_t chunk_size, chunk_pos;
  int64_t pos;              /* stream bytes the fast path consumed */
  int64_t base;             /* stream offset of libarchive's first byte: its offsets count from here */
  bool give_header;         /* libarchive reads header[] first, then the rest of chunk */
  uint8_t header[512];      /* the header being parsed, gathered across chunks */
  int64_t header_seen[2];   /* stream offsets of the last two headers, for prefetch_header_ahead */
  /* A TFRecord shard (named .tfrecord, see is_tfrecord): records read with the fast path's byte reader. */
  bool tfrecord;
  sf_tfrecord_options tfrecord_options; /* see sf_tar_reader_set_tfrecord */
};

/* Offsets count bytes of the tar stream; for a .tar.gz or .tar.zst that is not a position in the file. */
static const char *offset_note(const sf_tar_reader *t) {
  if (t->tfrecord && (t->gzip || t->zstd)) return " (byte offsets count the decompressed TFRecord stream)";
  bool compressed = t->gzip || (t->archive && archive_filter_count(t->archive) > 1);
  return compressed ? " (byte offsets count the decompressed tar stream)" : "";
}

/* Raw bytes of the shard read so far. */
static int64_t raw_offset(const sf_tar_reader *t) {
  return t->source ? sf_shard_reader_offset(t->source) : (int64_t)t->memory_pos;
}

/* The next raw chunk of the shard (borrowed until the next call): its size, 0 at the end, or an error in source_error. */
static ssize_t read_raw(sf_tar_reader *t, const void **data) {
  if (t->has_first) {
    t->has_first = false;
    *data = t->first;
    return t->first_size;
  }
  if (!t->source) {
    size_t n = t->memory_size - t->memory_pos;
    if (n > MEMORY_CHUNK) n = MEMORY_CHUNK;
    *data = (const uint8_t *)t->memory + t->memory_pos;
    t->memory_pos += n;
    return (ssize_t)n;
  }
  return sf_shard_reader_read(t->source, data, &t->source_error);
}

static const char *codec_name(const sf_tar_reader *t) { return t->gzip ? "gzip" : "zstd"; }

static int codec_error(sf_tar_reader *t, int code, const char *what) {
  int64_t at = raw_offset(t) - (int64_t)t->in_size;
  sf_error_set(&t->source_error, code, SF_AT(.url = t->url_text, .offset = at),
               "the %s stream %s (at byte %lld of the compressed file) — the shard is damaged, as "
               "%s -t shows; re-create or re-download it",
               codec_name(t), what, (long long)at, codec_name(t));
  return code;
}

/* Decompresses some of in into out; sets *n. Returns NULL, or what is wrong with the stream. */
static const char *decompress(sf_tar_reader *t, size_t *n, char *why, size_t why_size) {
  if (t->zstd) {
    ZSTD_inBuffer in = {t->in, t->in_size, 0};
    ZSTD_outBuffer out = {t->out, OUT_CHUNK, 0};
    size_t r = ZSTD_decompressStream(t->zstd, &out, &in); /* checks each frame's checksum at its end */
    t->in += in.pos;
    t->in_size -= in.pos;
    *n = out.pos;
    if (ZSTD_isError(r)) {
      snprintf(why, why_size, "is corrupt (zstd: %s)", ZSTD_getErrorName(r));
      return why;
    }
    t->frame_end = r == 0;
    return NULL;
  }
  z_stream *z = t->gzip;
  if (t->frame_end && t->in_size > 0) {
    inflateReset(z); /* another member follows (pigz, cat a.gz b.gz): it has its own CRC */
    t->frame_end = false;
  }
  z->next_in = (Bytef *)(uintptr_t)t->in;
  z->avail_in = (uInt)t->in_size;
  z->next_out = t->out;
  z->avail_out = OUT_CHUNK;
  int r = inflate(z, Z_NO_FLUSH); /* checks each member's CRC-32 and length at its end */
  t->in = z->next_in;
  t->in_size = z->avail_in;
  *n = OUT_CHUNK - z->avail_out;
  if (r == Z_STREAM_END) t->frame_end = true;
  if (r == Z_OK || r == Z_STREAM_END || r == Z_BUF_ERROR) return NULL;
  snprintf(why, why_size, "is corrupt (zlib: %s)", z->msg ? z->msg : "bad data");
  return why;
}

/*
 * The next decompressed chunk of a .tar.gz or .tar.zst. Damage that still
 * decompresses is found by the check at the end of its member or frame, at
 * the latest when the shard is drained.
 */
static ssize_t read_compressed(sf_tar_reader *t, const void **data) {
  if (t->codec_failed) return t->codec_failed;
  for (;;) {
    if (t->in_size == 0 && !t->raw_done) {
      const void *in;
      ssize_t n = read_raw(t, &in);
      if (n < 0) return n;
      t->raw_done = n == 0;
      t->in = in;
      t->in_size = (size_t)n;
    }
    if (t->in_size == 0 && t->raw_done && t->frame_end) return 0;
    size_t n = 0;
    char why[160];
    const char *bad = decompress(t, &n, why, sizeof why);
    if (bad) t->codec_failed = codec_error(t, SF_EFORMAT, bad);
    else if (n == 0 && t->in_size == 0 && t->raw_done)
      t->codec_failed = codec_error(t, SF_EFORMAT, "ends before its check (truncated)");
    /* Bytes decompressed before an error go on first: samples before the damage are read as with a cut tar. */
    if (n > 0) {
      *data = t->out;
      return (ssize_t)n;
    }
    if (t->codec_failed) return t->codec_failed;
  }
}

/* The next chunk of the tar stream (borrowed until the next call), decompressed when the shard is. */
static ssize_t read_stream(sf_tar_reader *t, const void **data) {
  return t->gzip || t->zstd ? read_compressed(t, data) : read_raw(t, data);
}

static la_ssize_t read_source(struct archive *a, void *opaque, const void **data) {
  sf_tar_reader *t = opaque;
  /* Taking over from the fast path: the header it stopped at, then what it had not read of its chunk. */
  if (t->give_header) {
    t->give_header = false;
    *data = t->header;
    return sizeof t->header;
  }
  if (t->chunk_pos < t->chunk_size) {
    *data = t->chunk + t->chunk_pos;
    size_t n = t->chunk_size - t->chunk_pos;
    t->chunk_pos = t->chunk_size;
    return (la_ssize_t)n;
  }
  /* Zero copy: libarchive reads straight from the shard reader's chunk (or zlib's output). */
  ssize_t n = read_stream(t, data);
  if (n < 0) {
    t->source_code = (int)n;
    archive_set_error(a, EIO, "%s", t->source_error.message);
    return -1;
  }
  return n;
}

/*
 * Marks the reader failed. key names the sample the failure cut (a member read
 * in part), or is NULL between samples: callers count a named sample as lost.
 * A failure of the shard reader underneath (network, pipe) wins over
 * libarchive's view of it, which is only "no more bytes".
 */
static int fail(sf_tar_reader *t, int code, const char *key, int64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int fail(sf_tar_reader *t, int code, const char *key, int64_t offset, const char *fmt, ...) {
  if (t->source_code < 0) {
    t->fatal = t->source_error;
    t->failed = t->source_code;
    snprintf(t->fatal.key, sizeof t->fatal.key, "%s", key ? key : "");
    return t->failed;
  }
  char message[sizeof t->fatal.message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  sf_error_set(&t->fatal, code, SF_AT(.url = t->url_text, .key = key, .offset = offset), "%s%s", message,
               offset_note(t));
  t->failed = code;
  return code;
}

/* " after sample KEY" for messages about a header, or "" before the first sample. */
static const char *after_key(const sf_tar_reader *t, char *buf, size_t size) {
  if (!t->last_key[0]) return "";
  snprintf(buf, size, " after sample %s", t->last_key);
  return buf;
}

static const char *archive_text(struct archive *a) {
  if (!a) return "the shard ends"; /* the fast path's only failure: libarchive reads damaged headers */
  const char *s = archive_error_string(a);
  return s ? s : "no detail";
}

/*
 * WebDataset's split of a member path into key and field: its regex
 * ^((?:.*\/|)[^.]+)[.]([^/]*)$ means the key runs to the first dot of the last
 * path component. A last component starting with a dot only matches when the
 * directory part before it has no dot in its last component: the key is then
 * the directory with its slash ("a/b/.c" -> "a/b/", field "c").
 * Returns the key length, or 0 when the member is not part of any sample.
 */
static size_t split_key(const sf_tar_reader *t, const char *path) {
  if (t->key_rule == SF_KEY_REGEX) {
    /* Group 1 is the key: it must start the path and be followed by a dot and a field name. */
    regmatch_t m[2];
    if (regexec(t->key_regex, path, 2, m, 0) != 0 || m[1].rm_so != 0 || m[1].rm_eo <= 0) return 0;
    size_t n = (size_t)m[1].rm_eo;
    return path[n] == '.' && path[n + 1] ? n : 0;
  }
  const char *slash = strrchr(path, '/');
  const char *base = slash ? slash + 1 : path;
  /* last_dot: the same rule with the basename's last dot, for names holding dots ("Track 2.0.mp3"). */
  const char *dot = t->key_rule == SF_KEY_LAST_DOT ? strrchr(base, '.') : strchr(base, '.');
  if (!dot) return 0;
  if (dot > base) return (size_t)(dot - path);
  if (!slash) return 0;
  const char *parent = slash;
  while (parent > path && parent[-1] != '/') parent--;
  if (memchr(parent, '.', (size_t)(slash - parent))) return 0;
  return (size_t)(dot - path);
}

/*
 * WebDataset's metadata members (tar_file_iterator's skip_meta regex
 * __[^/]*__($|/) at the start): the first path component starts and ends with
 * "__", like "__meta__" or "__meta__/inner.json". "__key__.txt" and
 * "__init__.py" are samples. (Its other rule, a top-level name both starting
 * and ending with "__", adds only "__" and "___", which have no key anyway.)
 */
static bool is_metadata(const char *path) {
  size_t first = strcspn(path, "/");
  return first >= 4 && strncmp(path, "__", 2) == 0 && strncmp(path + first - 2, "__", 2) == 0;
}

/*
 * Makes path the pending member when it belongs to a sample. Returns 1 when it does, 0 when the
 * member is passed over (metadata, no key), or an error.
 */
static int take_member(sf_tar_reader *t, const char *path, int64_t size, bool sparse, int64_t offset) {
  if (is_metadata(path)) return 0;
  size_t key_len = split_key(t, path);
  if (key_len == 0) return 0;
  size_t len = strlen(path);
  if (len + 1 > t->path_capacity) {
    char *grown = realloc(t->path, len + 1);
    if (!grown) return fail(t, SF_ENOMEM, NULL, offset, "out of memory reading a member name");
    t->path = grown;
    t->path_capacity = len + 1;
  }
  memcpy(t->path, path, len + 1);
  for (char *c = t->path + key_len + 1; *c; c++)
    if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
  t->key_len = key_len;
  t->field = t->path + key_len + 1;
  size_t kept = key_len < sizeof t->last_key - 1 ? key_len : sizeof t->last_key - 1; /* per member: no snprintf */
  memcpy(t->last_key, t->path, kept);
  t->last_key[kept] = '\0';
  t->size = size;
  if (t->size < 0)
    return fail(t, SF_EFORMAT, NULL, offset, "tar member %s has a negative size — the shard is "
                "damaged; re-create or re-download it", t->path);
  t->sparse = sparse;
  t->offset = offset;
  t->pending = true;
  return 1;
}

/*
 * Fast path: up to n next bytes of the stream at *data (borrowed until the next call). Returns how
 * many, 0 at the end, or the source's error (then in source_error, as read_source leaves it).
 */
static ssize_t fast_bytes(sf_tar_reader *t, size_t n, const uint8_t **data) {
  if (t->chunk_pos == t->chunk_size) {
    const void *chunk;
    ssize_t got = read_stream(t, &chunk);
    if (got < 0) t->source_code = (int)got;
    if (got <= 0) return got;
    t->chunk = chunk;
    t->chunk_size = (size_t)got;
    t->chunk_pos = 0;
  }
  size_t k = t->chunk_size - t->chunk_pos < n ? t->chunk_size - t->chunk_pos : n;
  *data = t->chunk + t->chunk_pos;
  t->chunk_pos += k;
  t->pos += (int64_t)k;
  return (ssize_t)k;
}

/* Fast path: copies the next size bytes into data (NULL: passes over them). Returns how many arrived. */
static int64_t fast_copy(sf_tar_reader *t, uint8_t *data, int64_t size) {
  int64_t got = 0;
  while (got < size) {
    const uint8_t *p;
    ssize_t n = fast_bytes(t, (size_t)(size - got), &p);
    if (n <= 0) break;
    if (data) memcpy(data + got, p, (size_t)n);
    got += n;
  }
  return got;
}

/* A tar number field as libarchive's bid accepts it, strictly octal: spaces, digits, then NULs or spaces. */
static bool octal_field(const uint8_t *p, size_t n, int64_t *value) {
  size_t i = 0;
  int64_t v = 0;
  while (i < n && p[i] == ' ') i++;
  size_t digits = i;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; i++) v = v * 8 + (p[i] - '0');
  if (i == digits || i - digits > 21) return false;
  for (; i < n; i++)
    if (p[i] != ' ' && p[i] != 0) return false;
  *value = v;
  return true;
}

/* The sum of a header's 512 bytes: SSE2's psadbw adds 16 bytes an instruction (a plain loop, vectorised,
   widens them first: four times the instructions, a few percent of a CIFAR run). */
static uint32_t byte_sum(const uint8_t *h) {
#ifdef __SSE2__
  __m128i acc = _mm_setzero_si128();
  for (int i = 0; i < 512; i += 16)
    acc = _mm_add_epi64(acc, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(h + i)), _mm_setzero_si128()));
  return (uint32_t)(_mm_cvtsi128_si64(acc) + _mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc)));
#else
  uint32_t sum = 0;
  for (int i = 0; i < 512; i++) sum += h[i];
  return sum;
#endif
}

/*
 * True for the header of a plain member: POSIX ustar, a regular file (typeflag '0' or NUL) without a
 * link name, a valid checksum and octal number fields, a path not ending in '/'. Sets its path
 * (prefix/name, as libarchive joins them; path holds 257 bytes) and size. Anything else is
 * libarchive's to read.
 */
static bool plain_header(const uint8_t *h, char *path, int64_t *size) {
  if (memcmp(h + 257, "ustar\0" "00", 8) != 0 || (h[156] != '0' && h[156] != 0) || h[157] != 0) return false;
  /* The checksum counts its own 8 bytes as spaces. */
  uint32_t sum = 8 * ' ' + byte_sum(h);
  for (int i = 148; i < 156; i++) sum -= h[i];
  int64_t stored, v;
  static const uint16_t fields[][2] = {{100, 8}, {108, 8}, {116, 8}, {136, 12}, {329, 8}, {337, 8}};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
    if (!octal_field(h + fields[i][0], fields[i][1], &v)) return false;
  if (!octal_field(h + 148, 8, &stored) || stored != (int64_t)sum || !octal_field(h + 124, 12, size)) return false;
  size_t name = strnlen((const char *)h, 100), prefix = strnlen((const char *)h + 345, 155), len = 0;
  if (name == 0) return false;
  if (prefix) {
    memcpy(path, h + 345, prefix);
    len = prefix;
    if (path[len - 1] != '/') path[len++] = '/';
  }
  memcpy(path + len, h, name);
  len += name;
  path[len] = '\0';
  return path[len - 1] != '/';
}

/* Starts libarchive on the stream from base on (the whole shard when base is 0). Returns 0 or fails. */
static int open_libarchive(sf_tar_reader *t) {
  t->archive = archive_read_new();
  if (!t->archive) return fail(t, SF_ENOMEM, NULL, t->base, "out of memory opening the shard");
  /* Only tar and its usual compressions: the other formats and filters are attack surface. */
  archive_read_support_format_tar(t->archive);
  archive_read_support_filter_none(t->archive);
  /* Taking over between members: no bid, libarchive reads on as it would have (damage included). */
  if (t->base > 0) archive_read_set_format(t->archive, ARCHIVE_FORMAT_TAR);
  if (archive_read_open(t->archive, t, NULL, read_source, NULL) == ARCHIVE_OK) return 0;
  char where[160];
  if (t->base > 0)
    return fail(t, SF_EFORMAT, NULL, t->base, "damaged tar stream%s (%s) — the shard is truncated or "
                "corrupt; re-create or re-download it", after_key(t, where, sizeof where),
                archive_text(t->archive));
  if (raw_offset(t) == 0)
    return fail(t, SF_EFORMAT, NULL, 0, "the shard is empty (0 bytes) — re-create or re-download it");
  return fail(t, SF_EFORMAT, NULL, 0, "cannot read the shard as a tar (%s) — it is damaged, or not a "
              ".tar, .tar.gz or .tar.zst file", archive_text(t->archive));
}

/*
 * Headers lie a member's bytes apart, further than a page in most shards, where the CPU's prefetchers do
 * not follow: each one was a cache and TLB miss. Samples of a shard are alike, so the header two headers
 * on from the one at offset lies as far again (the same member of the next sample when samples have two);
 * its line is brought in now. A hint: a wrong guess costs a line of bandwidth.
 */
static void prefetch_header_ahead(sf_tar_reader *t, int64_t offset) {
  int64_t before = t->header_seen[0];
  t->header_seen[0] = t->header_seen[1];
  t->header_seen[1] = offset;
  int64_t ahead = 2 * (offset - before) - (t->pos - offset); /* from the chunk's current position */
  if (before < offset && ahead >= 0 && (uint64_t)ahead < t->chunk_size - t->chunk_pos)
    __builtin_prefetch(t->chunk + t->chunk_pos + ahead);
}

/*
 * advance() on the fast path: reads plain members' headers until one belongs to a sample. Returns
 * 0 (pending set), an error, or 1 after handing the stream, from the current header on, to libarchive.
 */
static int fast_advance(sf_tar_reader *t) {
  char where[160];
  for (;;) {
    int64_t offset = t->pos;
    int64_t have = fast_copy(t, t->header, sizeof t->header);
    if (have == 0 && t->source_code == 0)
      return fail(t, SF_EFORMAT, NULL, offset, "the shard ends%s without tar's end-of-archive blocks — it "
                  "is truncated; re-create or re-download it", after_key(t, where, sizeof where));
    if (have < (int64_t)sizeof t->header)
      return fail(t, SF_EFORMAT, NULL, offset, "damaged tar stream%s (the shard ends inside a member "
                  "header) — the shard is truncated or corrupt; re-create or re-download it",
                  after_key(t, where, sizeof where));
    prefetch_header_ahead(t, offset);
    char path[257];
    int64_t size;
    if (!plain_header(t->header, path, &size)) {
      t->fast = false;
      t->base = offset;
      t->give_header = true;
      return open_libarchive(t) < 0 ? t->failed : 1;
    }
    int taken = take_member(t, path, size, false, offset);
    if (taken != 0) return taken < 0 ? taken : 0;
    /* Passed over: its bytes and their padding to the next 512-byte block. */
    int64_t span = (size + 511) / 512 * 512;
    if (fast_copy(t, NULL, span) < span) /* at how far it got, as libarchive says */
      return fail(t, SF_EFORMAT, NULL, t->pos, "damaged tar stream%s (the shard ends inside member %s) — "
                  "the shard is truncated or corrupt; re-create or re-download it",
                  after_key(t, where, sizeof where), path);
  }
}

/* Reads headers until the next member that belongs to a sample; sets pending or eof. */
static int advance(sf_tar_reader *t) {
  t->pending = false;
  if (t->failed) return t->failed; /* libarchive cannot go on after a fatal error */
  if (t->fast) {
    int r = fast_advance(t);
    if (r != 1) return r;
  }
  for (;;) {
    struct archive_entry *entry;
    int r = archive_read_next_header(t->archive, &entry);
    /* libarchive counts from where it started (base: after the fast path's members). */
    int64_t offset = archive_read_header_position(t->archive);
    if (r == ARCHIVE_EOF) {
      /* libarchive takes a clean end of data for the end: without tar's zero blocks, the shard was cut. */
      if (archive_filter_bytes(t->archive, 0) <= offset) {
        char where[160];
        return fail(t, SF_EFORMAT, NULL, t->base + offset,
                    "the shard ends%s without tar's end-of-archive blocks — it is truncated; "
                    "re-create or re-download it",
                    after_key(t, where, sizeof where));
      }
      t->eof = true;
      t->end_offset = t->base + offset;
      return 0;
    }
    /* After a fatal error libarchive no longer reports the header position: use how far it got. */
    if (offset < 0) offset = archive_filter_bytes(t->archive, 0);
    offset += t->base;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      char where[160];
      return fail(t, SF_EFORMAT, NULL, offset,
                  "damaged tar stream%s (%s) — the shard is truncated or corrupt; re-create or "
                  "re-download it",
                  after_key(t, where, sizeof where), archive_text(t->archive));
    }
    if (archive_entry_filetype(entry) != AE_IFREG || archive_entry_hardlink(entry)) continue;
    /* The raw name bytes (no charset conversion: keys compare as bytes, and it is per member). */
    const char *path = archive_entry_pathname(entry);
    if (!path) path = archive_entry_pathname_utf8(entry);
    if (!path) continue;
    int64_t size = archive_entry_size_is_set(entry) ? archive_entry_size(entry) : 0;
    int taken = take_member(t, path, size, archive_entry_sparse_count(entry) > 0, offset);
    if (taken != 0) return taken < 0 ? taken : 0;
  }
}

/* Records the first problem of a sample that does not stop the shard (EDUP, ETOOBIG). */
static void note_problem(sf_tar_reader *t, int *problem, sf_error *error, int code,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void note_problem(sf_tar_reader *t, int *problem, sf_error *error, int code,
                         const char *fmt, ...) {
  if (*problem) return;
  *problem = code;
  char message[sizeof error->message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  sf_error_set(error, code, SF_AT(.url = t->url_text, .key = t->last_key, .offset = t->offset), "%s%s", message,
               offset_note(t));
}

/*
 * The mapped shard (sf_shard_reader_mapping) the pending member can be a view of: the fast path reads
 * an uncompressed tar straight from it, and the member's bytes lie inside it (else, a shard cut short,
 * the copy path reports the truncation). NULL otherwise.
 */
static sf_buffer *member_mapping(const sf_tar_reader *t) {
  if (!t->fast || !t->source || t->gzip || t->zstd) return NULL;
  sf_buffer *mapping = sf_shard_reader_mapping(t->source);
  if (!mapping || t->pos < 0 || (uint64_t)t->pos + (uint64_t)t->size > sf_buffer_size(mapping)) return NULL;
  return mapping;
}

/* Whether the pending member may join sample: false, with the problem noted, when it may not (a duplicate, too big...). */
static bool member_fits(sf_tar_reader *t, sf_sample *sample, const char *field, int *problem, sf_error *error) {
  if (sf_sample_field(sample, field))
    note_problem(t, problem, error, SF_EDUP,
                 "field \"%s\" appears twice in one sample (member %s) — the second copy is "
                 "dropped; give each member of a sample a distinct extension",
                 field, t->path);
  /* A sparse member stores its holes in a few bytes; expanded, it may be any size. */
  else if (t->sparse)
    note_problem(t, problem, error, SF_EUNSUPPORTED,
                 "member %s is a sparse file (%lld bytes with its holes) — sparse members are "
                 "refused; re-create the shard without tar --sparse",
                 t->path, (long long)t->size);
  else if (t->size > t->max_member_size)
    note_problem(t, problem, error, SF_ETOOBIG,
                 "member %s is %lld bytes, over tar_split's max_member_size (%lld) — the sample is "
                 "skipped; raise max_member_size if members this large are expected",
                 t->path, (long long)t->size, (long long)t->max_member_size);
  else if (t->size > t->max_sample_size - t->sample_size)
    note_problem(t, problem, error, SF_ETOOBIG,
                 "with member %s the sample holds %lld bytes, over tar_split's max_sample_size "
                 "(%lld) — the sample is skipped; raise max_sample_size if samples this large are "
                 "expected",
                 t->path, (long long)(t->sample_size + t->size), (long long)t->max_sample_size);
  else if (strlen(field) >= SF_FIELD_NAME_MAX)
    note_problem(t, problem, error, SF_ETOOBIG,
                 "field name \"%s\" is longer than %d bytes — it is dropped; shorten the "
                 "member's extension",
                 field, SF_FIELD_NAME_MAX - 1);
  else if (sample->n_fields >= SF_MAX_FIELDS)
    note_problem(t, problem, error, SF_ETOOBIG,
                 "sample has more than %d fields — member %s is dropped", SF_MAX_FIELDS, t->path);
  else
    return true;
  return false;
}

/*
 * The pending member's bytes into data (NULL: a view of the mapping, only skipped past), through the fast path or
 * libarchive's blocks; *got says how many arrived. Returns whether the stream failed (a cut, a damaged block).
 */
static bool read_member(sf_tar_reader *t, uint8_t *data, int64_t span, int64_t *got_out) {
  int64_t got = 0;
  bool failed = false;
  if (t->fast) {
    got = fast_copy(t, data, t->size);
    failed = got < t->size || fast_copy(t, NULL, span - t->size) < span - t->size;
  }
  /* Block reads (not archive_read_data) so a truncation still tells how much arrived. */
  while (!t->fast) {
    const void *block;
    size_t n;
    la_int64_t at;
    int r = archive_read_data_block(t->archive, &block, &n, &at);
    if (r == ARCHIVE_EOF) break;
    /* Blocks of a member that is not sparse are contiguous. */
    if ((r != ARCHIVE_OK && r != ARCHIVE_WARN) || at != got || (int64_t)n > t->size - at) {
      failed = true;
      break;
    }
    memcpy(data + at, block, n);
    got = at + (int64_t)n;
  }
  *got_out = got;
  return failed;
}

/* Moves the pending member into sample as an encoded field (or drops it with a problem). */
static int consume(sf_tar_reader *t, sf_sample *sample, int *problem, sf_error *error) {
  const char *field = t->field;
  sf_buffer *buffer = NULL, *mapping = NULL;
  if (member_fits(t, sample, field, problem, error)) {
    if ((mapping = member_mapping(t)) != NULL)
      buffer = sf_buffer_ref(mapping); /* the member is a view of the mapped shard: no copy */
    else if (!(buffer = sf_buffer_new((size_t)t->size)))
      note_problem(t, problem, error, SF_ENOMEM, "out of memory for the %lld-byte member %s — the sample is skipped",
                   (long long)t->size, t->path);
  }
  int64_t span = (t->size + 511) / 512 * 512; /* the member's blocks */
  if (!buffer && t->fast) {
    if (fast_copy(t, NULL, t->size) < t->size)
      return fail(t, SF_EFORMAT, t->last_key, t->offset,
                  "truncated tar member %s (%s) — the sample is lost and the shard is damaged; "
                  "re-create or re-download it", t->path, archive_text(t->archive));
    fast_copy(t, NULL, span - t->size); /* a cut in the padding shows at the next header */
    return 0;
  }
  if (!buffer) {
    /* Passed over, never held: for a compressed shard libarchive decompresses into its own window. */
    if (archive_read_data_skip(t->archive) != ARCHIVE_OK)
      return fail(t, SF_EFORMAT, t->last_key, t->offset,
                  "truncated tar member %s (%s) — the sample is lost and the shard is damaged; "
                  "re-create or re-download it",
                  t->path, archive_text(t->archive));
    return 0;
  }
  /* A view starts where the member's bytes do (the fast path reads a plain tar: stream offset = file offset). */
  size_t view_offset = mapping ? (size_t)t->pos : 0;
  uint8_t *data = mapping ? NULL : sf_buffer_data(buffer);
  int64_t got = 0;
  bool failed = read_member(t, data, span, &got);
  if (failed && got == t->size) {
    /* Every byte of the member arrived, only the block padding after it did not: the member is whole. */
    char where[160];
    fail(t, SF_EFORMAT, NULL, t->offset + 512 + t->size,
         "damaged tar stream%s (%s) — the shard is truncated or corrupt; re-create or re-download it",
         after_key(t, where, sizeof where), archive_text(t->archive));
  } else if (failed || got < t->size) {
    sf_buffer_unref(&buffer);
    return fail(t, SF_EFORMAT, t->last_key, t->offset,
                "truncated tar member %s (expected %lld bytes, got %lld: %s) — the sample is lost "
                "and the shard is damaged; re-create or re-download it",
                t->path, (long long)t->size, (long long)got, archive_text(t->archive));
  }
  sf_tensor tensor;
  int rc = sf_tensor_view(&tensor, SF_DTYPE_UINT8, 1, &t->size, buffer, view_offset);
  if (rc < 0) return fail(t, SF_EINTERNAL, t->last_key, t->offset, "cannot wrap a member as a tensor");
  sf_sample_add_field(sample, field, true, &tensor);
  t->sample_size += t->size;
  return 0;
}

/*
 * After the end-of-archive blocks, reads what the source still has (record
 * padding, normally): a pipe: command's exit status and a transfer's failure
 * only show at the real end of the stream.
 */
static int drain_source(sf_tar_reader *t) {
  if (t->drained) return 0;
  t->drained = true;
  int64_t start = raw_offset(t);
  for (;;) {
    const void *data;
    ssize_t n = read_stream(t, &data);
    if (n == 0) return 0;
    if (n < 0) {
      t->source_code = (int)n;
      return fail(t, (int)n, NULL, raw_offset(t), "%s", t->source_error.message);
    }
    /* Trailing data after the archive is not ours to read; a pipe: command is then killed. */
    if (raw_offset(t) - start > DRAIN_MAX) return 0;
  }
}

/* Little-endian integers of a TFRecord frame. */
static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* An empty sample for record index at offset, keyed by key (its fields come later, if any). NULL when out of memory. */
static sf_sample *record_sample(const sf_tar_reader *t, uint64_t index, int64_t offset, const char *key) {
  sf_sample *sample = sf_sample_new();
  if (!sample || sf_sample_set_key(sample, key, strlen(key)) < 0) {
    sf_sample_destroy(&sample);
    return NULL;
  }
  sample->url = sf_buffer_ref(t->url);
  sample->index = index;
  sample->offset = offset;
  return sample;
}

/*
 * Reads the data and CRC of a record whose frame said length (within the limits) into *sample. Returns 0;
 * an error of this record alone (why says what, *sample is emptied); or the reader's failure (t->failed).
 */
static int read_record(sf_tar_reader *t, uint64_t length, sf_sample **sample, char *why, size_t why_size) {
  const sf_sample *s = *sample;
  uint8_t *data = malloc((size_t)length + SF_TFRECORD_FOOTER);
  if (!data)
    return fail(t, SF_ENOMEM, s->key, s->offset, "out of memory for the %llu-byte record %llu",
                (unsigned long long)length, (unsigned long long)s->index);
  int64_t want = (int64_t)length + SF_TFRECORD_FOOTER, got = fast_copy(t, data, want);
  if (got < want) {
    free(data);
    return fail(t, SF_EFORMAT, s->key, s->offset, "the shard ends inside record %llu (%lld of its %lld bytes and "
                "CRC) — the record is lost and the shard is truncated; re-create or re-download it",
                (unsigned long long)s->index, (long long)got, (long long)want);
  }
  int rc = 0;
  if (sf_tfrecord_masked_crc(data, (size_t)length) != le32(data + length))
    rc = SF_EFORMAT, snprintf(why, why_size, "record %llu's data fails its CRC32C — the record is damaged and "
                              "skipped; re-create or re-download the shard", (unsigned long long)s->index);
  else
    rc = sf_tfrecord_parse_example(data, (size_t)length, &t->tfrecord_options, *sample, why, why_size);
  free(data);
  if (rc < 0 && (*sample)->n_fields > 0) {
    /* Fields before the failure go: the record is skipped whole. */
    sf_sample *empty = record_sample(t, s->index, s->offset, s->key);
    if (!empty) return fail(t, SF_ENOMEM, s->key, s->offset, "out of memory for a sample");
    sf_sample_destroy(sample);
    *sample = empty;
  }
  return rc;
}

/*
 * sf_tar_reader_next() for a TFRecord shard: one record, framed as uint64 length, masked CRC32C of
 * those 8 bytes, the data, masked CRC32C of the data (all little-endian), parsed as a tf.train.Example.
 * A length whose CRC fails, or a shard cut inside a record, stops the shard (the next frame cannot be
 * found); a record whose data CRC fails, one that is no Example, or one over the limits is only that
 * record's loss: an empty sample comes back with the error, and reading goes on.
 */
static int tfrecord_next(sf_tar_reader *t, sf_sample **out, sf_error *error) {
  int64_t offset = t->pos;
  uint64_t index = t->index;
  uint8_t frame[SF_TFRECORD_HEADER];
  int64_t got = fast_copy(t, frame, sizeof frame);
  if (got == 0 && t->source_code == 0) {
    t->eof = true;
    if (drain_source(t) < 0) goto failed;
    return SF_EOF;
  }
  if (got < (int64_t)sizeof frame) {
    fail(t, SF_EFORMAT, NULL, offset, "the shard ends inside the frame of record %llu (%lld of %d bytes) — it is "
         "truncated; re-create or re-download it", (unsigned long long)index, (long long)got, SF_TFRECORD_HEADER);
    goto failed;
  }
  if (sf_tfrecord_masked_crc(frame, 8) != le32(frame + 8)) {
    fail(t, SF_EFORMAT, NULL, offset, "record %llu's length fails its CRC32C (length field 0x%016llx) — the shard is "
         "damaged and the records after it cannot be found; re-create or re-download it",
         (unsigned long long)index, (unsigned long long)le64(frame));
    goto failed;
  }
  uint64_t length = le64(frame);
  t->index++;
  int64_t span = SF_TFRECORD_HEADER + SF_TFRECORD_FOOTER + (int64_t)(length < (uint64_t)1 << 62 ? length : 0);
  if (span > t->largest_span) t->largest_span = span;
  char key[24];
  snprintf(key, sizeof key, "%llu", (unsigned long long)index);
  sf_sample *sample = record_sample(t, index, offset, key);
  if (!sample) {
    fail(t, SF_ENOMEM, NULL, offset, "out of memory for a sample");
    goto failed;
  }
  char why[200];
  int rc;
  int64_t limit = t->max_member_size < t->max_sample_size ? t->max_member_size : t->max_sample_size;
  if (length > (uint64_t)limit) {
    /* The length is checked: the record can be passed over, never held. */
    int64_t skip = length > (uint64_t)INT64_MAX - SF_TFRECORD_FOOTER ? INT64_MAX : (int64_t)length + SF_TFRECORD_FOOTER;
    if (fast_copy(t, NULL, skip) < skip)
      rc = fail(t, SF_EFORMAT, key, offset, "the shard ends inside record %llu — it is truncated; re-create or "
                "re-download it", (unsigned long long)index);
    else
      rc = SF_ETOOBIG, snprintf(why, sizeof why, "record %llu is %llu bytes, over tar_split's max_member_size or "
                                "max_sample_size (%lld) — it is skipped; raise them if records this large are "
                                "expected", (unsigned long long)index, (unsigned long long)length, (long long)limit);
  } else {
    rc = read_record(t, length, &sample, why, sizeof why);
  }
  if (t->failed) {
    sf_sample_destroy(&sample);
    goto failed;
  }
  if (rc < 0)
    sf_error_set(error, rc, SF_AT(.url = t->url_text, .key = key, .offset = offset), "%s%s", why, offset_note(t));
  *out = sample;
  return rc;

failed:
  if (error) *error = t->fatal;
  return t->failed;
}

int sf_tar_reader_next(sf_tar_reader *t, sf_sample **out, sf_error *error) {
  *out = NULL;
  if (t->failed) {
    if (error) *error = t->fatal;
    return t->failed;
  }
  if (t->tfrecord) return tfrecord_next(t, out, error);
  if (!t->pending && !t->eof && advance(t) < 0) goto failed;
  if (t->eof) {
    if (drain_source(t) < 0) goto failed;
    return SF_EOF;
  }

  sf_sample *sample = sf_sample_new();
  if (!sample || sf_sample_set_key(sample, t->path, t->key_len) < 0) {
    sf_sample_destroy(&sample);
    fail(t, SF_ENOMEM, NULL, t->offset, "out of memory for a sample");
    goto failed;
  }
  size_t key_len = t->key_len;
  int problem = 0;
  t->sample_size = 0;
  sample->url = sf_buffer_ref(t->url);
  sample->index = t->index++;
  sample->offset = t->offset;
  /*
   * A sample is complete when the next member has another key or the shard
   * ends. A member cut short loses the sample; a damaged header after whole
   * members does not (tarfile and WebDataset read them too): the sample goes
   * out, and the failure, kept sticky, comes with the next call.
   */
  do {
    if (consume(t, sample, &problem, error) < 0) {
      sf_sample_destroy(&sample);
      goto failed;
    }
  } while (advance(t) == 0 && t->pending && t->key_len == key_len &&
           memcmp(t->path, sample->key, key_len) == 0);
  if (t->pending && t->offset - sample->offset > t->largest_span) t->largest_span = t->offset - sample->offset;
  *out = sample;
  return problem;

failed:
  if (error) *error = t->fatal;
  return t->failed;
}

bool sf_tar_reader_failed(const sf_tar_reader *t) { return t->failed != 0; }

int64_t sf_tar_reader_source_bytes(const sf_tar_reader *t) { return raw_offset(t); }

int64_t sf_tar_reader_next_offset(const sf_tar_reader *t) {
  if (t->failed || t->tfrecord) return -1;
  if (t->pending) return t->offset;
  return t->eof ? t->end_offset : -1;
}

bool sf_tar_reader_ready(sf_tar_reader *t) {
  if (!t->source || t->failed || t->eof) return true;
  /* The next sample, its successor's header and the end blocks: judged by the largest sample so far. */
  return sf_shard_reader_ready(t->source, t->largest_span ? t->largest_span + 3 * 512 : 1);
}

void sf_tar_reader_set_key_rule(sf_tar_reader *t, sf_key_rule rule, const regex_t *regex) {
  t->key_rule = rule == SF_KEY_REGEX && !regex ? SF_KEY_FIRST_DOT : rule;
  t->key_regex = regex;
}

void sf_tar_reader_set_tfrecord(sf_tar_reader *t, const sf_tfrecord_options *options) {
  t->tfrecord_options = *options;
}

void sf_tar_reader_set_limits(sf_tar_reader *t, int64_t max_member_size, int64_t max_sample_size) {
  t->max_member_size = max_member_size;
  t->max_sample_size = max_sample_size;
}

/* Reads the first chunk and sets up zlib or zstd when it starts with their magic. Returns 0 or an error in source_error. */
static int open_codec(sf_tar_reader *t) {
  const void *first;
  ssize_t n = read_raw(t, &first);
  if (n < 0) return (int)n;
  static const uint8_t gzip_magic[] = {0x1f, 0x8b}, zstd_magic[] = {0x28, 0xb5, 0x2f, 0xfd};
  bool gzip = n >= 2 && memcmp(first, gzip_magic, 2) == 0;
  bool zstd = n >= 4 && memcmp(first, zstd_magic, 4) == 0;
  if (!gzip && !zstd) {
    t->has_first = true;
    t->first = first;
    t->first_size = n;
    return 0;
  }
  t->in = first;
  t->in_size = (size_t)n;
  t->out = malloc(OUT_CHUNK);
  if (t->out && gzip) {
    t->gzip = calloc(1, sizeof *t->gzip);
    if (t->gzip && inflateInit2(t->gzip, 16 + MAX_WBITS) != Z_OK) {
      free(t->gzip); /* not initialised: inflateEnd must not see it */
      t->gzip = NULL;
    }
  }
  if (t->out && zstd) t->zstd = ZSTD_createDStream();
  if (!t->out || (!t->gzip && !t->zstd)) {
    sf_error_set(&t->source_error, SF_ENOMEM, SF_AT(.url = t->url_text), "out of memory opening the shard");
    return SF_ENOMEM;
  }
  return 0;
}

bool sf_tar_reader_is_tfrecord(const char *url) {
  /* The name ends at an http(s) URL's query or fragment. */
  size_t len = strncmp(url, "http", 4) == 0 ? strcspn(url, "?#") : strlen(url);
  static const char *const suffixes[] = {".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecords.gz",
                                         ".tfrecord.zst", ".tfrecords.zst", NULL};
  for (const char *const *s = suffixes; *s; s++) {
    size_t n = strlen(*s);
    if (len >= n && strncasecmp(url + len - n, *s, n) == 0) return true;
  }
  return false;
}

static int open_archive(sf_tar_reader *t, const char *url, sf_error *error) {
  (void)sf_parse_size(SF_TAR_MAX_MEMBER_SIZE, &t->max_member_size);
  (void)sf_parse_size(SF_TAR_MAX_SAMPLE_SIZE, &t->max_sample_size);
  size_t len = strlen(url);
  t->url = sf_buffer_new(len + 1);
  if (!t->url) {
    sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory opening the shard");
    return SF_ENOMEM;
  }
  memcpy(sf_buffer_data(t->url), url, len + 1);
  t->url_text = (const char *)sf_buffer_data(t->url);
  int rc = open_codec(t);
  if (rc < 0) {
    if (error) *error = t->source_error;
    return rc;
  }
  if ((t->tfrecord = sf_tar_reader_is_tfrecord(url))) return 0; /* records are read with fast_copy from the start */
  /* An uncompressed shard that starts with a plain member starts on the fast path. */
  char path[257];
  int64_t size;
  if (t->has_first && t->first_size >= 512 && plain_header(t->first, path, &size)) {
    t->fast = true;
    t->has_first = false;
    t->chunk = t->first;
    t->chunk_size = (size_t)t->first_size;
    return 0;
  }
  if (open_libarchive(t) < 0) {
    if (error) *error = t->fatal;
    return t->failed;
  }
  return 0;
}

int sf_tar_reader_open(sf_tar_reader **reader, const char *url,
                       const sf_shard_reader_options *options, sf_error *error) {
  *reader = NULL;
  sf_tar_reader *t = calloc(1, sizeof *t);
  if (!t) {
    sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory opening the shard");
    return SF_ENOMEM;
  }
  int rc = sf_shard_reader_open(&t->source, url, options, error);
  if (rc == 0) rc = open_archive(t, url, error);
  if (rc < 0) {
    sf_tar_reader_close(&t);
    return rc;
  }
  *reader = t;
  return 0;
}

int sf_tar_reader_open_memory(sf_tar_reader **reader, const void *data, size_t size,
                              const char *url, sf_error *error) {
  *reader = NULL;
  sf_tar_reader *t = calloc(1, sizeof *t);
  if (!t) {
    sf_error_set(error, SF_ENOMEM, SF_AT(.url = url), "out of memory opening the shard");
    return SF_ENOMEM;
  }
  t->memory = data;
  t->memory_size = size;
  int rc = open_archive(t, url ? url : "memory", error);
  if (rc < 0) {
    sf_tar_reader_close(&t);
    return rc;
  }
  *reader = t;
  return 0;
}

void sf_tar_reader_close(sf_tar_reader **reader) {
  if (!reader || !*reader) return;
  sf_tar_reader *t = *reader;
  if (t->archive) archive_read_free(t->archive);
  if (t->gzip) inflateEnd(t->gzip);
  free(t->gzip);
  ZSTD_freeDStream(t->zstd);
  free(t->out);
  sf_shard_reader_close(&t->source);
  sf_buffer_unref(&t->url);
  free(t->path);
  free(t);
  *reader = NULL;
}
