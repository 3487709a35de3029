/* Unit tests for the tar reader (grouping, skips, errors, filters, URL kinds) and the tar_split stage. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include <archive.h>
#include <archive_entry.h>
#include <cmocka.h>

#include "harness.h"
#include "prefetch.h"
#include "tar_reader.h"
#include "tfrecord.h"
#include "shardflow/stage.h"

typedef struct member {
  const char *name;
  const char *data;  /* NULL: directory (or link when link is set) */
  const char *link;  /* symlink target, or hardlink target when hard */
  int hard;
} member;

/* Member rows: a file with data, a directory, a symlink, a hard link, the end of a list. */
#define FILE_(n, d) {.name = (n), .data = (d)}
#define DIR_(n) {.name = (n)}
#define SYMLINK_(n, to) {.name = (n), .link = (to)}
#define HARDLINK_(n, to) {.name = (n), .link = (to), .hard = 1}
#define END_ {.name = NULL}

enum { FILTER_NONE, FILTER_GZIP, FILTER_ZSTD };

/* Writes members as a tar (ustar headers for short names: offsets are 512 + padded data each). */
static uint8_t *build_tar(const member *m, int filter, size_t *size) {
  size_t cap = 1 << 20;
  uint8_t *buf = malloc(cap);
  assert_non_null(buf);
  struct archive *a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (filter == FILTER_GZIP) archive_write_add_filter_gzip(a);
  if (filter == FILTER_ZSTD) archive_write_add_filter_zstd(a);
  archive_write_set_bytes_in_last_block(a, 1);
  assert_int_equal(archive_write_open_memory(a, buf, cap, size), ARCHIVE_OK);
  for (; m->name; m++) {
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, m->name);
    archive_entry_set_perm(e, 0644);
    if (m->link && m->hard) {
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_hardlink(e, m->link);
      archive_entry_set_size(e, 0);
    } else if (m->link) {
      archive_entry_set_filetype(e, AE_IFLNK);
      archive_entry_set_symlink(e, m->link);
    } else if (!m->data) {
      archive_entry_set_filetype(e, AE_IFDIR);
      archive_entry_set_perm(e, 0755);
    } else {
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_size(e, (la_int64_t)strlen(m->data));
    }
    assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
    if (m->data && !m->link) archive_write_data(a, m->data, strlen(m->data));
    archive_entry_free(e);
  }
  assert_int_equal(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
  return buf;
}

/* Byte offset of member i's header in a ustar archive of m. */
static int64_t ustar_offset(const member *m, int i) {
  int64_t at = 0;
  for (int k = 0; k < i; k++) {
    size_t n = m[k].data && !m[k].link ? strlen(m[k].data) : 0;
    at += 512 + (int64_t)((n + 511) / 512 * 512);
  }
  return at;
}

static sf_tar_reader *open_memory(const uint8_t *data, size_t size) {
  sf_tar_reader *t = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_open_memory(&t, data, size, "mem.tar", &e), 0);
  return t;
}

/* Checks one sample: key, comma-separated fields, their bytes (|-separated), offset. */
static void expect_sample(sf_tar_reader *t, int want_rc, const char *key, const char *fields,
                          const char *datas, int64_t offset) {
  sf_sample *s = NULL;
  sf_error e;
  int rc = sf_tar_reader_next(t, &s, &e);
  assert_int_equal(rc, want_rc);
  assert_non_null(s);
  assert_string_equal(s->key, key);
  assert_string_equal(sf_sample_url(s), "mem.tar");
  if (offset >= 0) assert_int_equal(s->offset, offset);
  char got[256] = "", gotd[256] = "";
  for (int i = 0; i < s->n_fields; i++) {
    const sf_field *f = &s->fields[i];
    assert_true(f->encoded);
    assert_int_equal(f->tensor.dtype, SF_DTYPE_UINT8);
    assert_int_equal(f->tensor.ndim, 1);
    strcat(got, i ? "," : "");
    strcat(got, f->name);
    strcat(gotd, i ? "|" : "");
    strncat(gotd, sf_tensor_data(&f->tensor), (size_t)f->tensor.shape[0]);
  }
  assert_string_equal(got, fields);
  if (datas) assert_string_equal(gotd, datas);
  sf_sample_destroy(&s);
}

static void expect_eof(sf_tar_reader *t) {
  sf_sample *s = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EOF);
  assert_null(s);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EOF);
}

static const member grouping[] = {
    FILE_("a.jpg", "J1"),
    FILE_("a.CLS", "1"),
    FILE_("a.seg.PNG", "P"),
    FILE_("b.jpg", "J2"),
    FILE_("dir.v2/b.c/x.y.z", "xyz"),
    FILE_("a.txt", "again"),       /* not consecutive with the first a: a new sample */
    FILE_("c.", "empty-field"),    /* WebDataset keeps an empty extension */
    FILE_("e.bin", ""),            /* empty member */
    END_,
};

static void test_grouping(void **state) {
  size_t size;
  uint8_t *tar = build_tar(grouping, FILTER_NONE, &size);
  sf_tar_reader *t = open_memory(tar, size);
  expect_sample(t, 0, "a", "jpg,cls,seg.png", "J1|1|P", ustar_offset(grouping, 0));
  expect_sample(t, 0, "b", "jpg", "J2", ustar_offset(grouping, 3));
  expect_sample(t, 0, "dir.v2/b.c/x", "y.z", "xyz", ustar_offset(grouping, 4));
  expect_sample(t, 0, "a", "txt", "again", ustar_offset(grouping, 5));
  expect_sample(t, 0, "c", "", "empty-field", ustar_offset(grouping, 6));
  expect_sample(t, 0, "e", "bin", "", ustar_offset(grouping, 7));
  expect_eof(t);
  sf_tar_reader_close(&t);
  assert_null(t);
  free(tar);
}

static const member dotted[] = {
    FILE_("Track 2.0.mp3", "M"),
    FILE_("Track 2.0.JSON", "J"),
    FILE_("a.b.c.d", "abcd"),
    FILE_("dir.v2/b.c/x.y.z", "xyz"),
    END_,
};

/* The three key rules over names holding dots; the regex skips what it does not match. */
static void test_key_rules(void **state) {
  size_t size;
  uint8_t *tar = build_tar(dotted, FILTER_NONE, &size);
  sf_tar_reader *t = open_memory(tar, size);
  expect_sample(t, 0, "Track 2", "0.mp3,0.json", "M|J", 0);
  expect_sample(t, 0, "a", "b.c.d", "abcd", -1);
  expect_sample(t, 0, "dir.v2/b.c/x", "y.z", "xyz", -1);
  expect_eof(t);
  sf_tar_reader_close(&t);
  t = open_memory(tar, size);
  sf_tar_reader_set_key_rule(t, SF_KEY_LAST_DOT, NULL);
  expect_sample(t, 0, "Track 2.0", "mp3,json", "M|J", 0);
  expect_sample(t, 0, "a.b.c", "d", "abcd", -1);
  expect_sample(t, 0, "dir.v2/b.c/x.y", "z", "xyz", -1);
  expect_eof(t);
  sf_tar_reader_close(&t);
  regex_t re;
  assert_int_equal(regcomp(&re, "^(.*)[.](mp3|JSON|z)$", REG_EXTENDED), 0);
  t = open_memory(tar, size);
  sf_tar_reader_set_key_rule(t, SF_KEY_REGEX, &re);
  expect_sample(t, 0, "Track 2.0", "mp3,json", "M|J", 0);
  expect_sample(t, 0, "dir.v2/b.c/x.y", "z", "xyz", -1);
  expect_eof(t);
  sf_tar_reader_close(&t);
  regfree(&re);
  free(tar);
}

static void test_sample_index_and_url_shared(void **state) {
  size_t size;
  uint8_t *tar = build_tar(grouping, FILTER_NONE, &size);
  sf_tar_reader *t = open_memory(tar, size);
  sf_sample *a = NULL, *b = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_next(t, &a, &e), 0);
  assert_int_equal(sf_tar_reader_next(t, &b, &e), 0);
  assert_int_equal(a->index, 0);
  assert_int_equal(b->index, 1);
  assert_ptr_equal(a->url, b->url); /* one URL buffer per shard */
  sf_tar_reader_close(&t);
  assert_string_equal(sf_sample_url(a), "mem.tar"); /* samples outlive the reader */
  sf_sample_destroy(&a);
  sf_sample_destroy(&b);
  free(tar);
}

static const member skips[] = {
    FILE_("__meta__", "m"),
    FILE_("__info.json", "i"),                   /* WebDataset keeps it: key "__info" */
    DIR_("top"),
    FILE_("top/x.jpg", "X"),
    SYMLINK_("link.jpg", "top/x.jpg"),
    HARDLINK_("hard.jpg", "top/x.jpg"),
    FILE_("noext", "n"),
    FILE_(".hidden", "h"),
    FILE_("top/y.jpg", "Y"),
    FILE_("top/.z", "Z"),                        /* WebDataset: key "top/" */
    FILE_("a.b/.w", "W"),                        /* dotted parent: no key at all */
    FILE_("sub/__meta__.json", "S"),             /* only a first component __NAME__ is metadata */
    FILE_("__meta__/inner.json", "I"),           /* like this one */
    FILE_("__key__.txt", "K"),                   /* WebDataset keeps it */
    END_,
};

static void test_skips(void **state) {
  size_t size;
  uint8_t *tar = build_tar(skips, FILTER_NONE, &size);
  sf_tar_reader *t = open_memory(tar, size);
  expect_sample(t, 0, "__info", "json", "i", ustar_offset(skips, 1));
  expect_sample(t, 0, "top/x", "jpg", "X", ustar_offset(skips, 3));
  expect_sample(t, 0, "top/y", "jpg", "Y", ustar_offset(skips, 8));
  expect_sample(t, 0, "top/", "z", "Z", ustar_offset(skips, 9));
  expect_sample(t, 0, "sub/__meta__", "json", "S", ustar_offset(skips, 11));
  expect_sample(t, 0, "__key__", "txt", "K", ustar_offset(skips, 13));
  expect_eof(t);
  sf_tar_reader_close(&t);
  free(tar);
}

static const member dups[] = {
    FILE_("a.jpg", "1"), FILE_("a.JPG", "2"), FILE_("a.cls", "3"), FILE_("b.jpg", "4"), END_,
};

static void test_duplicate_field(void **state) {
  size_t size;
  uint8_t *tar = build_tar(dups, FILTER_NONE, &size);
  sf_tar_reader *t = open_memory(tar, size);
  sf_sample *s = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EDUP);
  assert_non_null(s);
  assert_int_equal(e.code, SF_EDUP);
  assert_string_equal(e.url, "mem.tar");
  assert_string_equal(e.key, "a");
  assert_int_equal(e.offset, ustar_offset(dups, 1));
  assert_non_null(strstr(e.message, "jpg"));
  assert_int_equal(s->n_fields, 2); /* the first jpg and the cls */
  assert_string_equal(s->fields[0].name, "jpg");
  assert_int_equal(((uint8_t *)sf_tensor_data(&s->fields[0].tensor))[0], '1');
  sf_sample_destroy(&s);
  expect_sample(t, 0, "b", "jpg", "4", ustar_offset(dups, 3));
  expect_eof(t);
  sf_tar_reader_close(&t);
  free(tar);
}

static void test_limits(void **state) {
  char longkey[200], longfield[64];
  memset(longkey, 'k', sizeof longkey);
  strcpy(longkey + 150, ".jpg");
  strcpy(longfield, "f.");
  memset(longfield + 2, 'e', 40);
  longfield[42] = '\0';
  member m[24] = {FILE_(longkey, "L"), FILE_(longfield, "F"), FILE_("f.ok", "O")};
  static char names[SF_MAX_FIELDS + 1][16];
  int n = 3;
  for (int i = 0; i <= SF_MAX_FIELDS; i++, n++) {
    snprintf(names[i], sizeof names[i], "g.f%d", i);
    m[n] = (member)FILE_(names[i], "x");
  }
  m[n] = (member)FILE_("h.jpg", "H");
  size_t size;
  uint8_t *tar = build_tar(m, FILTER_NONE, &size);
  sf_tar_reader *t = open_memory(tar, size);
  sf_sample *s = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_next(t, &s, &e), 0); /* keys have no length limit */
  assert_int_equal(strlen(s->key), 150);
  sf_sample_destroy(&s);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_ETOOBIG);
  assert_string_equal(s->key, "f");
  assert_int_equal(s->n_fields, 1);
  assert_string_equal(s->fields[0].name, "ok");
  sf_sample_destroy(&s);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_ETOOBIG);
  assert_string_equal(s->key, "g");
  assert_int_equal(s->n_fields, SF_MAX_FIELDS);
  sf_sample_destroy(&s);
  expect_sample(t, 0, "h", "jpg", "H", -1);
  expect_eof(t);
  sf_tar_reader_close(&t);
  free(tar);
}

/* A sparse pax member claiming 2 GiB takes a few bytes in the tar: refused unread, the sample goes on. */
static void test_sparse_member(void **state) {
  size_t cap = 1 << 16, size;
  uint8_t *buf = malloc(cap);
  struct archive *a = archive_write_new();
  archive_write_set_format_pax(a);
  assert_int_equal(archive_write_open_memory(a, buf, cap, &size), ARCHIVE_OK);
  struct archive_entry *e = archive_entry_new();
  archive_entry_set_pathname(e, "big.bin");
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0644);
  archive_entry_set_size(e, (la_int64_t)2 << 30);
  archive_entry_sparse_add_entry(e, ((la_int64_t)2 << 30) - 4, 4);
  assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
  archive_write_data(a, "tail", 4);
  archive_entry_clear(e);
  archive_entry_set_pathname(e, "big.cls");
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0644);
  archive_entry_set_size(e, 1);
  assert_int_equal(archive_write_header(a, e), ARCHIVE_OK);
  archive_write_data(a, "7", 1);
  archive_entry_free(e);
  assert_int_equal(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);

  sf_tar_reader *t = open_memory(buf, size);
  sf_tar_reader_set_limits(t, (int64_t)4 << 30, (int64_t)4 << 30); /* refused for being sparse, not for its size */
  sf_sample *s = NULL;
  sf_error err;
  assert_int_equal(sf_tar_reader_next(t, &s, &err), SF_EUNSUPPORTED);
  assert_non_null(strstr(err.message, "big.bin is a sparse file"));
  assert_string_equal(err.key, "big");
  assert_string_equal(s->key, "big");
  assert_int_equal(s->n_fields, 1);
  assert_string_equal(s->fields[0].name, "cls");
  sf_sample_destroy(&s);
  expect_eof(t);
  sf_tar_reader_close(&t);
  free(buf);
}

/* max_member_size and max_sample_size: the member that crosses one is dropped, the shard goes on. */
static void test_member_limits(void **state) {
  static char m2000[2001], m900[901];
  memset(m2000, 'x', 2000);
  memset(m900, 'y', 900);
  const member m[] = {
      FILE_("a.jpg", m2000), FILE_("a.cls", "1"),
      FILE_("b.x", m900),    FILE_("b.y", m900), FILE_("b.z", m900), /* 2700 bytes together */
      FILE_("c.jpg", m900),  END_,
  };
  size_t size;
  uint8_t *tar = build_tar(m, FILTER_NONE, &size);
  sf_tar_reader *t = open_memory(tar, size);
  sf_tar_reader_set_limits(t, 1024, 2048);
  sf_sample *s = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_ETOOBIG);
  assert_non_null(strstr(e.message, "a.jpg is 2000 bytes, over tar_split's max_member_size (1024)"));
  assert_string_equal(e.key, "a");
  assert_int_equal(s->n_fields, 1);
  sf_sample_destroy(&s);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_ETOOBIG);
  assert_non_null(strstr(e.message, "with member b.z the sample holds 2700 bytes, over tar_split's max_sample_size (2048)"));
  assert_int_equal(s->n_fields, 2);
  sf_sample_destroy(&s);
  /* The sample limit is per sample: c starts again from 0 bytes. */
  assert_int_equal(sf_tar_reader_next(t, &s, &e), 0);
  assert_string_equal(s->key, "c");
  assert_int_equal(s->fields[0].tensor.shape[0], 900);
  sf_sample_destroy(&s);
  expect_eof(t);
  sf_tar_reader_close(&t);
  free(tar);
}

static const member two[] = {
    FILE_("s0.jpg", "0123456789abcdef0123456789abcdef"), FILE_("s0.cls", "0"),
    FILE_("s1.jpg", "fedcba9876543210fedcba9876543210"), FILE_("s1.cls", "1"), END_,
};

static void test_truncated(void **state) {
  size_t size;
  uint8_t *tar = build_tar(two, FILTER_NONE, &size);
  /* Cut inside s1.jpg's data. */
  int64_t cut = ustar_offset(two, 2) + 512 + 10;
  sf_tar_reader *t = open_memory(tar, (size_t)cut);
  expect_sample(t, 0, "s0", "jpg,cls", NULL, 0);
  sf_sample *s = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT);
  assert_null(s);
  assert_int_equal(e.offset, ustar_offset(two, 2));
  assert_string_equal(e.key, "s1");
  assert_string_equal(e.url, "mem.tar");
  assert_non_null(strstr(e.message, "expected 32 bytes, got 10"));
  /* Sticky: reading cannot go on. */
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT);
  sf_tar_reader_close(&t);

  /* Cut inside the second header: s0's members so far are whole, so it goes on (as tarfile reads
   * it); the error follows, naming no key since no sample was cut. */
  t = open_memory(tar, (size_t)ustar_offset(two, 1) + 100);
  expect_sample(t, 0, "s0", "jpg", NULL, 0);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT);
  assert_null(s);
  assert_int_equal(e.offset, ustar_offset(two, 1));
  assert_string_equal(e.key, "");
  assert_non_null(strstr(e.message, "after sample s0"));
  sf_tar_reader_close(&t);

  /* Cut in the block padding after s0.cls: every byte of it arrived, so s0 is whole. */
  t = open_memory(tar, (size_t)ustar_offset(two, 1) + 512 + 1 + 100);
  expect_sample(t, 0, "s0", "jpg,cls", NULL, 0);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT);
  assert_string_equal(e.key, "");
  sf_tar_reader_close(&t);

  /* Cut at a member boundary: libarchive sees a clean end, but tar's end-of-archive blocks are missing. */
  t = open_memory(tar, (size_t)ustar_offset(two, 2));
  expect_sample(t, 0, "s0", "jpg,cls", NULL, 0);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT);
  assert_int_equal(e.offset, ustar_offset(two, 2));
  assert_non_null(strstr(e.message, "end-of-archive"));
  sf_tar_reader_close(&t);
  free(tar);
}

/* Reads every sample of a tar: "key:field=bytes,...@offset" lines and the error's place; returns the code that ended it. */
static int read_all(const uint8_t *tar, size_t size, char *out, size_t out_size, int64_t shift) {
  sf_tar_reader *t = open_memory(tar, size);
  sf_sample *s = NULL;
  sf_error e;
  int rc;
  size_t n = 0;
  out[0] = '\0';
  while ((rc = sf_tar_reader_next(t, &s, &e)) >= 0 || s) {
    n += (size_t)snprintf(out + n, out_size - n, "%s:", s->key);
    for (int i = 0; i < s->n_fields; i++)
      n += (size_t)snprintf(out + n, out_size - n, "%s=%.*s,", s->fields[i].name,
                            (int)s->fields[i].tensor.shape[0], (const char *)sf_tensor_data(&s->fields[i].tensor));
    n += (size_t)snprintf(out + n, out_size - n, "@%lld\n", (long long)(s->offset - shift));
    assert_true(n < out_size);
    sf_sample_destroy(&s);
  }
  if (rc != SF_EOF) /* where the error is, and the sample it cut */
    n += (size_t)snprintf(out + n, out_size - n, "error at %lld key %s\n", (long long)(e.offset - shift), e.key);
  assert_true(n < out_size);
  sf_tar_reader_close(&t);
  return rc;
}

/* The reader parses plain ustar members itself and hands the rest of the shard to libarchive at the first
 * other header. Reference: libarchive alone, made to read the same members from the start by a leading
 * directory (not a plain member): same samples, bytes and errors, offsets 512 bytes later. */
static void test_plain_members_as_libarchive(void **state) {
  (void)state;
  static char big[1500], exact[513], longname[300], prefixed[140];
  memset(big, 'b', sizeof big - 1);
  memset(exact, 'e', sizeof exact - 1);
  memset(longname, 'n', sizeof longname - 1);
  memcpy(longname + sizeof longname - 5, ".TXT", 4); /* over 255 bytes: a pax header, libarchive takes over */
  memset(prefixed, 'p', sizeof prefixed - 1);
  prefixed[60] = '/'; /* 139 bytes: ustar's prefix and name fields */
  memcpy(prefixed + sizeof prefixed - 5, ".Jpg", 4);
  const member plain[] = {
      FILE_("a.jpg", "A"), FILE_("a.CLS", "1"), FILE_("__meta__", "m"), FILE_("nodot", "x"),
      FILE_("b.seg.png", big), FILE_("b.txt", ""), FILE_("c.bin", exact), FILE_(prefixed, "P"),
      FILE_("d.cls", "4"), SYMLINK_("d.lnk", "a.jpg"), FILE_("d.txt", "after a symlink"),
      FILE_(longname, "L"), FILE_("e.cls", "5"), END_,
  };
  for (int variant = 0; variant < 2; variant++) {
    member m[32] = {DIR_("dir")};
    int n = 0;
    for (; plain[n].name; n++) m[n + 1] = plain[n];
    if (variant == 1) { /* a pax header before the second member: libarchive takes over early */
      m[n + 1] = (member)END_;
      m[2] = (member)FILE_(longname, "L");
    }
    size_t size, ref_size;
    uint8_t *tar = build_tar(m + 1, FILTER_NONE, &size), *ref = build_tar(m, FILTER_NONE, &ref_size);
    static char got[8192], want[8192];
    assert_int_equal(read_all(tar, size, got, sizeof got, 0), SF_EOF);
    assert_non_null(strstr(got, variant ? "a:jpg=A,@0\n" : "a:jpg=A,cls=1,@0\n"));
    assert_non_null(strstr(got, "e:cls=5,@"));
    for (size_t cut = size; cut > 512; cut -= 7) { /* 7: every offset within a block, over the archive */
      /* Cut at many places (inside members, headers, padding). */
      int rc = read_all(tar, cut, got, sizeof got, 0);
      int ref_rc = read_all(ref, cut + 512, want, sizeof want, 512);
      assert_string_equal(got, want);
      assert_int_equal(rc, ref_rc);
    }
    free(tar);
    free(ref);
  }
}

static void test_not_a_tar(void **state) {
  static const uint8_t junk[1024] = "this is not a tar file at all";
  sf_tar_reader *t = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_open_memory(&t, junk, sizeof junk, "junk.tar", &e), SF_EFORMAT);
  assert_null(t);
  assert_string_equal(e.url, "junk.tar");
  assert_int_equal(sf_tar_reader_open_memory(&t, junk, 0, "empty.tar", &e), SF_EFORMAT);
  assert_non_null(strstr(e.message, "empty"));
  /* Two zero blocks: a valid tar with no members. */
  static const uint8_t zeros[1024];
  assert_int_equal(sf_tar_reader_open_memory(&t, zeros, sizeof zeros, "z.tar", &e), 0);
  expect_eof(t);
  sf_tar_reader_close(&t);
}

static void test_filters(void **state) {
  for (int filter = FILTER_GZIP; filter <= FILTER_ZSTD; filter++) {
    size_t size;
    uint8_t *tar = build_tar(grouping, filter, &size);
    sf_tar_reader *t = open_memory(tar, size);
    expect_sample(t, 0, "a", "jpg,cls,seg.png", "J1|1|P", 0);
    expect_sample(t, 0, "b", "jpg", "J2", ustar_offset(grouping, 3));
    sf_tar_reader_close(&t); /* closing mid-shard is fine */
    /* A truncated compressed stream is a format error, not a crash. */
    t = NULL;
    sf_error e;
    int rc = sf_tar_reader_open_memory(&t, tar, size / 2, "mem.tar", &e);
    if (rc == 0) {
      sf_sample *s = NULL;
      while ((rc = sf_tar_reader_next(t, &s, &e)) == 0) sf_sample_destroy(&s);
      sf_tar_reader_close(&t);
    }
    assert_int_equal(rc, SF_EFORMAT);
    if (filter == FILTER_GZIP) {
      /* A wrong CRC-32 in the trailer: every sample is whole, then the shard's damage is reported. */
      tar[size - 8] ^= 1;
      t = open_memory(tar, size);
      sf_sample *s = NULL;
      int n = 0;
      while ((rc = sf_tar_reader_next(t, &s, &e)) == 0) sf_sample_destroy(&s), n++;
      assert_int_equal(n, 6);
      assert_int_equal(rc, SF_EFORMAT);
      assert_non_null(strstr(e.message, "gzip stream is corrupt (zlib: incorrect data check)"));
      assert_string_equal(e.key, "");
      sf_tar_reader_close(&t);
    }
    free(tar);
  }
}

/* Writes the grouping tar to a temp file; returns its path (static). */
static const char *write_temp_tar(void) {
  static char path[64];
  strcpy(path, "/tmp/sf_test_tar_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  size_t size;
  uint8_t *tar = build_tar(grouping, FILTER_NONE, &size);
  assert_int_equal(write(fd, tar, size), (ssize_t)size);
  close(fd);
  free(tar);
  return path;
}

static void count_samples(const char *url, const sf_shard_reader_options *o, int want_open,
                          int want_samples, int want_end) {
  sf_tar_reader *t = NULL;
  sf_error e;
  int rc = sf_tar_reader_open(&t, url, o, &e);
  assert_int_equal(rc, want_open);
  if (rc < 0) {
    assert_null(t);
    assert_string_equal(e.url, url);
    assert_true(e.message[0] != '\0');
    return;
  }
  int n = 0;
  sf_sample *s = NULL;
  while ((rc = sf_tar_reader_next(t, &s, &e)) == 0) {
    assert_string_equal(sf_sample_url(s), url);
    sf_sample_destroy(&s);
    n++;
  }
  assert_int_equal(rc, want_end);
  assert_int_equal(n, want_samples);
  if (rc != SF_EOF) assert_string_equal(e.url, url);
  sf_tar_reader_close(&t);
}

static void test_url_kinds(void **state) {
  const char *path = write_temp_tar();
  char url[600];
  sf_shard_reader_options pipes = {.allow_pipe = true};
  count_samples(path, NULL, 0, 6, SF_EOF);
  snprintf(url, sizeof url, "file://%s", path);
  count_samples(url, NULL, 0, 6, SF_EOF);
  snprintf(url, sizeof url, "pipe:cat %s", path);
  count_samples(url, NULL, SF_EDENIED, 0, 0);
  count_samples(url, &pipes, 0, 6, SF_EOF);
  /* The command's failure after a complete tar is still an error. */
  snprintf(url, sizeof url, "pipe:cat %s; exit 3", path);
  count_samples(url, &pipes, 0, 6, SF_EIO);
  /* Closing early kills a command that would run for a long time. */
  snprintf(url, sizeof url, "pipe:cat %s; sleep 30", path);
  sf_tar_reader *t = NULL;
  sf_sample *s = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_open(&t, url, &pipes, &e), 0);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), 0);
  sf_sample_destroy(&s);
  sf_tar_reader_close(&t);
  count_samples("/nonexistent/shard.tar", NULL, SF_ENOENT, 0, 0);
  count_samples("file:///nonexistent/shard.tar", NULL, SF_ENOENT, 0, 0);
  count_samples("ftp://host/shard.tar", NULL, SF_EUNSUPPORTED, 0, 0); /* s3:// and gs:// are read now */
  count_samples("", NULL, SF_EINVAL, 0, 0);
  unlink(path);
}

/* A loopback server that sends headers and 1 KiB of a promised 1 MB body, then goes quiet. */
static void *stalling_server(void *arg) {
  int listener = *(int *)arg;
  int c = accept(listener, NULL, NULL);
  if (c >= 0) {
    char request[4096];
    (void)!read(c, request, sizeof request);
    static char reply[2048] = "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n";
    size_t head = strlen(reply);
    (void)!write(c, reply, head + 1024);
    /* Wait (bounded) for the client to give up and close. */
    struct pollfd p = {.fd = c, .events = POLLIN};
    for (int i = 0; i < 10 && poll(&p, 1, 1000) == 0; i++) {
    }
    close(c);
  }
  close(listener);
  return NULL;
}

static void test_http_stall(void **state) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof addr;
  assert_int_equal(bind(listener, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(listener, 1), 0);
  assert_int_equal(getsockname(listener, (struct sockaddr *)&addr, &len), 0);
  pthread_t thread;
  pthread_create(&thread, NULL, stalling_server, &listener);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/stall.tar", ntohs(addr.sin_port));
  sf_shard_reader_options o = {.connect_timeout = 2, .stall_timeout = 1};
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  sf_tar_reader *t = NULL;
  sf_error e;
  int rc = sf_tar_reader_open(&t, url, &o, &e);
  if (rc == 0) {
    sf_sample *s = NULL;
    rc = sf_tar_reader_next(t, &s, &e);
    sf_sample_destroy(&s);
    sf_tar_reader_close(&t);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  assert_int_equal(rc, SF_ETIMEDOUT);
  assert_string_equal(e.url, url);
  assert_non_null(strstr(e.message, "stall_timeout"));
  double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  /* libcurl averages the speed over the last ~5 s, so a stall shows up to that much later. */
  assert_true(took >= 0.9 && took < 15);
  assert_int_equal(e.offset, 1024);
  pthread_join(thread, NULL);
}

/* ---- the tar_split stage, through the harness ---- */

static void push_shard(sf_harness *h, const char *url, uint64_t epoch, uint64_t index,
                       uint64_t spe) {
  sf_shard *shard = sf_shard_new(url);
  shard->epoch = epoch;
  shard->index = index;
  shard->pass = 0;
  shard->samples_per_epoch = spe;
  sf_item item = {.kind = SF_ITEM_SHARD, .epoch = epoch, .u.shard = shard};
  sf_harness_push(h, &item);
}

/* Pops everything; returns a string like "a@0,b@0,|0," (samples key@epoch, | = epoch end). */
static void drain(sf_harness *h, char *out, size_t size) {
  out[0] = '\0';
  sf_item item;
  while (sf_harness_pop(h, &item) == 0) {
    char one[160];
    if (item.kind == SF_ITEM_SAMPLE)
      snprintf(one, sizeof one, "%s@%llu,", item.u.sample->key,
               (unsigned long long)item.u.sample->epoch);
    else if (item.kind == SF_ITEM_EPOCH_END)
      snprintf(one, sizeof one, "|%llu,", (unsigned long long)item.epoch);
    else
      snprintf(one, sizeof one, "?,");
    strncat(out, one, size - strlen(out) - 1);
    sf_item_clear(&item);
  }
}

static void test_stage_one_pass(void **state) {
  const char *path = write_temp_tar();
  sf_harness *h = NULL;
  sf_error e;
  assert_int_equal(sf_harness_new(&h, "tar_split", NULL, 1, 0, 0, 1, &e), 0);
  push_shard(h, path, 0, 7, 0);
  push_shard(h, "/nonexistent.tar", 0, 8, 0); /* skipped under the default policy */
  sf_item end = {.kind = SF_ITEM_EPOCH_END, .epoch = 0};
  sf_harness_push(h, &end);
  push_shard(h, path, 1, 7, 0);
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  char got[1024];
  drain(h, got, sizeof got);
  assert_string_equal(got, "a@0,b@0,dir.v2/b.c/x@0,a@0,c@0,e@0,|0,"
                           "a@1,b@1,dir.v2/b.c/x@1,a@1,c@1,e@1,");
  assert_int_equal(sf_harness_error_count(h), 1);
  assert_int_equal(sf_harness_last_error(h)->code, SF_ENOENT);
  assert_string_equal(sf_harness_last_error(h)->url, "/nonexistent.tar");
  sf_harness_destroy(&h);
  unlink(path);
}

static void test_stage_samples_per_epoch(void **state) {
  const char *path = write_temp_tar();
  sf_harness *h = NULL;
  sf_error e;
  assert_int_equal(sf_harness_new(&h, "tar_split", NULL, 1, 0, 0, 1, &e), 0);
  /* 6 samples per shard, 8 per epoch: the second shard is cut after 2. */
  push_shard(h, path, 0, 0, 8);
  push_shard(h, path, 0, 1, 8);
  push_shard(h, path, 0, 2, 8); /* arrives after the cut: dropped */
  push_shard(h, path, 1, 0, 8);
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  char got[2048];
  drain(h, got, sizeof got);
  assert_string_equal(got, "a@0,b@0,dir.v2/b.c/x@0,a@0,c@0,e@0,a@0,b@0,|0,"
                           "a@1,b@1,dir.v2/b.c/x@1,a@1,c@1,e@1,");
  assert_int_equal(sf_harness_error_count(h), 0);
  sf_harness_destroy(&h);
  unlink(path);
}

static void test_stage_errors(void **state) {
  size_t size;
  uint8_t *tar = build_tar(dups, FILTER_NONE, &size);
  char path[] = "/tmp/sf_test_dup_XXXXXX";
  int fd = mkstemp(path);
  assert_int_equal(write(fd, tar, size), (ssize_t)size);
  close(fd);
  free(tar);

  sf_harness *h = NULL;
  sf_error e;
  const char *const opts[] = {"connect_timeout=2s", "stall_timeout=5s", NULL};
  assert_int_equal(sf_harness_new(&h, "tar_split", opts, 1, 0, 0, 1, &e), 0);
  push_shard(h, path, 0, 0, 0);
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EOF);
  char got[256];
  drain(h, got, sizeof got);
  assert_string_equal(got, "b@0,"); /* sample a dropped under skip */
  assert_int_equal(sf_harness_skipped(h), 1);
  assert_int_equal(sf_harness_last_error(h)->code, SF_EDUP);
  assert_string_equal(sf_harness_last_error(h)->key, "a");
  sf_harness_destroy(&h);

  assert_int_equal(sf_harness_new(&h, "tar_split", NULL, 1, 0, 0, 1, &e), 0);
  sf_harness_set_error_policy(h, 1);
  push_shard(h, path, 0, 0, 0);
  sf_harness_close_input(h);
  assert_int_equal(sf_harness_run(h, 0), SF_EDUP);
  sf_harness_destroy(&h);

  /* pipe: without allow_pipe on the shard is refused. */
  assert_int_equal(sf_harness_new(&h, "tar_split", NULL, 1, 0, 0, 1, &e), 0);
  sf_harness_set_error_policy(h, 1);
  char url[300];
  snprintf(url, sizeof url, "pipe:cat %s", path);
  push_shard(h, url, 0, 0, 0);
  assert_int_equal(sf_harness_run(h, 0), SF_EDENIED);
  sf_harness_destroy(&h);
  unlink(path);
}

/* ---- out of file descriptors: a limit to raise, retried, never "check the path", never skipped ---- */

/* Lowers the soft RLIMIT_NOFILE to the lowest free descriptor, so the next open fails with EMFILE; returns it. */
static rlim_t exhaust_descriptors(struct rlimit *saved) {
  assert_int_equal(getrlimit(RLIMIT_NOFILE, saved), 0);
  int lowest = dup(0);
  assert_true(lowest >= 0);
  close(lowest);
  struct rlimit low = {.rlim_cur = (rlim_t)lowest, .rlim_max = saved->rlim_max};
  assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
  return (rlim_t)lowest;
}

static void *restore_limit_soon(void *saved) {
  nanosleep(&(struct timespec){.tv_nsec = 150 * 1000 * 1000}, NULL);
  setrlimit(RLIMIT_NOFILE, saved);
  return NULL;
}

static void expect_fd_limit(int rc, const sf_error *e, const char *url, rlim_t limit) {
  char want[128];
  snprintf(want, sizeof want, "too many open files (the process's limit is %llu: raise ulimit -n)",
           (unsigned long long)limit);
  assert_int_equal(rc, SF_EMFILE);
  assert_string_equal(e->url, url);
  if (!strstr(e->message, want)) fail_msg("'%s' does not say '%s'", e->message, want);
  assert_null(strstr(e->message, "check the path"));
}

static void test_out_of_descriptors(void **state) {
  const char *path = write_temp_tar();
  char file_url[600], pipe_url[600];
  snprintf(file_url, sizeof file_url, "file://%s", path);
  snprintf(pipe_url, sizeof pipe_url, "pipe:cat %s", path);
  /* A remote shard: the prefetcher (thread, libcurl's wakeup pair) starts before the limit bites, as
   * tar_split's does with its first shard; connections to a port nobody accepts on are never made. */
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof addr;
  assert_int_equal(bind(listener, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(listener, 4), 0);
  assert_int_equal(getsockname(listener, (struct sockaddr *)&addr, &len), 0);
  char http_url[64];
  snprintf(http_url, sizeof http_url, "http://127.0.0.1:%d/shard.tar", ntohs(addr.sin_port));
  sf_prefetch_options po = {.max_transfers = 1, .connect_timeout = 2, .retries = 2, .retry_wait = 0.01,
                            .retry_max_wait = 0.02};
  sf_prefetch *prefetch = NULL;
  sf_error e;
  assert_int_equal(sf_prefetch_new(&prefetch, &po, &e), 0);

  sf_shard_reader_options o = {.allow_pipe = true, .retries = 2, .retry_wait = 0.01, .retry_max_wait = 0.02,
                               .prefetch = prefetch};
  struct rlimit saved;
  rlim_t limit = exhaust_descriptors(&saved);
  sf_tar_reader *t = NULL;
  expect_fd_limit(sf_tar_reader_open(&t, path, &o, &e), &e, path, limit);
  expect_fd_limit(sf_tar_reader_open(&t, file_url, &o, &e), &e, file_url, limit);
  expect_fd_limit(sf_tar_reader_open(&t, pipe_url, &o, &e), &e, pipe_url, limit);
  expect_fd_limit(sf_tar_reader_open(&t, http_url, &o, &e), &e, http_url, limit);
  assert_null(t);

  /* The limit comes back while the reader waits between retries: the shard opens and reads whole. */
  pthread_t thread;
  pthread_create(&thread, NULL, restore_limit_soon, &saved);
  sf_shard_reader_options patient = {.retries = 8, .retry_wait = 0.02, .retry_max_wait = 0.1};
  assert_int_equal(sf_tar_reader_open(&t, path, &patient, &e), 0);
  pthread_join(thread, NULL);
  int n = 0, rc;
  sf_sample *s = NULL;
  while ((rc = sf_tar_reader_next(t, &s, &e)) == 0) {
    sf_sample_destroy(&s);
    n++;
  }
  assert_int_equal(rc, SF_EOF);
  assert_int_equal(n, 6);
  sf_tar_reader_close(&t);

  /* tar_split, under the default skip policy: a shard it cannot open for want of descriptors stops the
   * stage with the limit's error, instead of being skipped like a bad path (an epoch short of samples). */
  sf_harness *h = NULL;
  const char *const opts[] = {"retries=1", "retry_wait=10ms", NULL};
  assert_int_equal(sf_harness_new(&h, "tar_split", opts, 1, 0, 0, 1, &e), 0);
  push_shard(h, path, 0, 0, 0);
  push_shard(h, path, 0, 1, 0);
  sf_harness_close_input(h);
  limit = exhaust_descriptors(&saved);
  rc = sf_harness_run(h, 0);
  setrlimit(RLIMIT_NOFILE, &saved);
  assert_int_equal(rc, SF_EMFILE);
  expect_fd_limit(sf_harness_last_error(h)->code, sf_harness_last_error(h), path, limit);
  sf_harness_destroy(&h);

  sf_prefetch_destroy(&prefetch);
  close(listener);
  unlink(path);
}

/* ---- TFRecord ---- */

/* RFC 3720 B.4's CRC32C vectors, and TFRecord's mask, from its definition. */
static void test_crc32c_vectors(void **state) {
  (void)state;
  uint8_t b[32];
  memset(b, 0, sizeof b);
  assert_int_equal(sf_crc32c(0, b, 32), 0x8A9136AAu);
  memset(b, 0xff, sizeof b);
  assert_int_equal(sf_crc32c(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
  assert_int_equal(sf_crc32c(0, b, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) b[i] = (uint8_t)(31 - i);
  assert_int_equal(sf_crc32c(0, b, 32), 0x113FDB5Cu);
  /* Continued in pieces (the slicing loop and the byte loop both) equals one pass. */
  for (int i = 0; i < 32; i++) b[i] = (uint8_t)i;
  assert_int_equal(sf_crc32c(sf_crc32c(0, b, 13), b + 13, 19), 0x46DD794Eu);
  uint32_t c = 0x46DD794Eu;
  assert_int_equal(sf_tfrecord_masked_crc(b, 32), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

/* Protobuf wire bytes, written by hand. */
typedef struct pb { uint8_t d[4096]; size_t n; } pb;

static void pb_varint(pb *p, uint64_t v) {
  do {
    p->d[p->n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
}

static void pb_bytes(pb *p, int field, const void *data, size_t n) {
  pb_varint(p, (uint64_t)field << 3 | 2);
  pb_varint(p, n);
  memcpy(p->d + p->n, data, n);
  p->n += n;
}

/* A Features entry: key and a Feature (kind 1 bytes_list, 2 float_list, 3 int64_list) holding list bytes. */
static void pb_entry(pb *features, const char *key, int kind, const pb *list) {
  pb feature = {0}, entry = {0};
  pb_bytes(&feature, kind, list->d, list->n);
  pb_bytes(&entry, 1, key, strlen(key));
  pb_bytes(&entry, 2, feature.d, feature.n);
  pb_bytes(features, 1, entry.d, entry.n);
}

/* An Example: image/encoded (bytes), label (int64 scalar), bbox (3 floats, packed). */
static void example(pb *out, const char *image, int64_t label) {
  pb bytes = {0}, ints = {0}, floats = {0}, packed = {0}, features = {0};
  pb_bytes(&bytes, 1, image, strlen(image));
  pb_varint(&ints, 1 << 3 | 0);
  pb_varint(&ints, (uint64_t)label);
  float f[3] = {0.25f, -1.5f, 3.0f};
  pb_bytes(&packed, 1, f, sizeof f);
  memcpy(floats.d, packed.d, packed.n);
  floats.n = packed.n;
  pb_entry(&features, "image/encoded", 1, &bytes);
  pb_entry(&features, "label", 3, &ints);
  pb_entry(&features, "bbox", 2, &floats);
  memset(out, 0, sizeof *out);
  pb_bytes(out, 1, features.d, features.n);
}

/* Appends one TFRecord frame around data. */
static void frame(uint8_t *shard, size_t *n, const void *data, size_t len) {
  uint8_t h[12];
  for (int i = 0; i < 8; i++) h[i] = (uint8_t)((uint64_t)len >> (8 * i));
  uint32_t c = sf_tfrecord_masked_crc(h, 8);
  for (int i = 0; i < 4; i++) h[8 + i] = (uint8_t)(c >> (8 * i));
  memcpy(shard + *n, h, 12);
  memcpy(shard + *n + 12, data, len);
  c = sf_tfrecord_masked_crc(data, len);
  for (int i = 0; i < 4; i++) shard[*n + 12 + len + i] = (uint8_t)(c >> (8 * i));
  *n += 12 + len + 4;
}

static sf_tar_reader *open_tfrecord(const uint8_t *data, size_t size, const char *url) {
  sf_tar_reader *t = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_open_memory(&t, data, size, url, &e), 0);
  return t;
}

/* Three records become samples keyed 0, 1, 2 with the features as fields; then the end. */
static void test_tfrecord_records(void **state) {
  (void)state;
  static uint8_t shard[1 << 14];
  size_t n = 0, offsets[3];
  const char *images[3] = {"JPEGBYTES-0", "jpeg-one", ""};
  for (int i = 0; i < 3; i++) {
    pb ex;
    example(&ex, images[i], 10 + i);
    offsets[i] = n;
    frame(shard, &n, ex.d, ex.n);
  }
  assert_true(sf_tar_reader_is_tfrecord("s3://b/train-00001.tfrecord"));
  assert_true(sf_tar_reader_is_tfrecord("https://h/x.TFRecord.gz?sig=1"));
  assert_true(sf_tar_reader_is_tfrecord("a.tfrecords.zst"));
  assert_false(sf_tar_reader_is_tfrecord("a.tfrecord.tar"));
  assert_false(sf_tar_reader_is_tfrecord("https://h/a.tar?x=.tfrecord"));
  sf_tar_reader *t = open_tfrecord(shard, n, "mem.tfrecord");
  for (int i = 0; i < 3; i++) {
    sf_sample *s = NULL;
    sf_error e;
    assert_int_equal(sf_tar_reader_next(t, &s, &e), 0);
    char key[8];
    snprintf(key, sizeof key, "%d", i);
    assert_string_equal(s->key, key);
    assert_int_equal(s->index, i);
    assert_int_equal(s->offset, offsets[i]);
    assert_string_equal(sf_sample_url(s), "mem.tfrecord");
    assert_int_equal(s->n_fields, 3);
    sf_field *img = sf_sample_field(s, "image/encoded");
    assert_non_null(img);
    assert_true(img->encoded);
    assert_int_equal(img->tensor.shape[0], strlen(images[i]));
    assert_memory_equal(sf_tensor_data(&img->tensor), images[i], strlen(images[i]));
    sf_field *label = sf_sample_field(s, "label");
    assert_false(label->encoded);
    assert_int_equal(label->tensor.dtype, SF_DTYPE_INT64);
    assert_int_equal(label->tensor.ndim, 0);
    assert_int_equal(*(int64_t *)sf_tensor_data(&label->tensor), 10 + i);
    sf_field *bbox = sf_sample_field(s, "bbox");
    assert_int_equal(bbox->tensor.dtype, SF_DTYPE_FLOAT32);
    assert_int_equal(bbox->tensor.ndim, 1);
    assert_int_equal(bbox->tensor.shape[0], 3);
    assert_true(((float *)sf_tensor_data(&bbox->tensor))[1] == -1.5f);
    sf_sample_destroy(&s);
  }
  sf_sample *s = NULL;
  sf_error e;
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EOF);
  sf_tar_reader_close(&t);
  /* Keyed by a feature: label's value, and label is no field. */
  t = open_tfrecord(shard, n, "mem.tfrecord");
  const char *fields[] = {"jpg=image/encoded"};
  sf_tar_reader_set_tfrecord(t, &(sf_tfrecord_options){.key_feature = "label", .fields = fields, .n_fields = 1});
  assert_int_equal(sf_tar_reader_next(t, &s, &e), 0);
  assert_string_equal(s->key, "10");
  assert_null(sf_sample_field(s, "label"));
  assert_int_equal(s->n_fields, 2);
  assert_true(sf_sample_field(s, "jpg")->encoded);
  sf_sample_destroy(&s);
  sf_tar_reader_close(&t);
  t = open_tfrecord(shard, n, "mem.tfrecord");
  sf_tar_reader_set_tfrecord(t, &(sf_tfrecord_options){.key_feature = "id"});
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_ENOENT);
  assert_non_null(s);
  assert_int_equal(s->n_fields, 0);
  assert_non_null(strstr(e.message, "\"id\""));
  sf_sample_destroy(&s);
  sf_tar_reader_close(&t);
}

/* Damage: a data CRC (the record skipped, reading goes on), a length CRC and a cut (the shard stops), with offsets. */
static void test_tfrecord_damage(void **state) {
  (void)state;
  static uint8_t shard[1 << 14], bad[1 << 14];
  size_t n = 0, offsets[3];
  for (int i = 0; i < 3; i++) {
    pb ex;
    example(&ex, "img", i);
    offsets[i] = n;
    frame(shard, &n, ex.d, ex.n);
  }
  sf_sample *s = NULL;
  sf_error e;
  /* One byte of record 1's data flipped. */
  memcpy(bad, shard, n);
  bad[offsets[1] + 12 + 3] ^= 0x40;
  sf_tar_reader *t = open_tfrecord(bad, n, "bad.tfrecord");
  assert_int_equal(sf_tar_reader_next(t, &s, &e), 0);
  sf_sample_destroy(&s);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT);
  assert_non_null(s); /* only this record is lost */
  assert_int_equal(e.offset, offsets[1]);
  assert_string_equal(e.url, "bad.tfrecord");
  assert_non_null(strstr(e.message, "data fails its CRC32C"));
  sf_sample_destroy(&s);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), 0);
  assert_string_equal(s->key, "2");
  sf_sample_destroy(&s);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EOF);
  sf_tar_reader_close(&t);
  /* Record 2's data CRC itself flipped: the same. */
  memcpy(bad, shard, n);
  bad[n - 1] ^= 1;
  t = open_tfrecord(bad, n, "bad.tfrecord");
  for (int i = 0; i < 2; i++) {
    assert_int_equal(sf_tar_reader_next(t, &s, &e), 0);
    sf_sample_destroy(&s);
  }
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT);
  assert_non_null(s);
  assert_int_equal(e.offset, offsets[2]);
  sf_sample_destroy(&s);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EOF);
  sf_tar_reader_close(&t);
  /* Record 1's length changed: its CRC fails, and the shard stops there. */
  memcpy(bad, shard, n);
  bad[offsets[1]] ^= 2;
  t = open_tfrecord(bad, n, "bad.tfrecord");
  assert_int_equal(sf_tar_reader_next(t, &s, &e), 0);
  sf_sample_destroy(&s);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT);
  assert_null(s);
  assert_int_equal(e.offset, offsets[1]);
  assert_non_null(strstr(e.message, "length fails its CRC32C"));
  assert_true(sf_tar_reader_failed(t));
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT); /* sticky */
  sf_tar_reader_close(&t);
  /* Cut inside record 2's data, then inside its frame. */
  size_t cuts[2] = {n - 5, offsets[2] + 7};
  for (int c = 0; c < 2; c++) {
    t = open_tfrecord(shard, cuts[c], "cut.tfrecord");
    for (int i = 0; i < 2; i++) {
      assert_int_equal(sf_tar_reader_next(t, &s, &e), 0);
      sf_sample_destroy(&s);
    }
    assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT);
    assert_null(s);
    assert_int_equal(e.offset, offsets[2]);
    assert_non_null(strstr(e.message, "truncated"));
    sf_tar_reader_close(&t);
  }
  /* A record that is not an Example (CRCs good): skipped alone. */
  size_t m = 0;
  uint8_t junk[] = {0xff, 0xff, 0xff};
  frame(bad, &m, junk, sizeof junk);
  memcpy(bad + m, shard, n);
  t = open_tfrecord(bad, m + n, "junk.tfrecord");
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_EFORMAT);
  assert_non_null(s);
  assert_int_equal(e.offset, 0);
  assert_non_null(strstr(e.message, "not a tf.train.Example"));
  sf_sample_destroy(&s);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), 0);
  assert_string_equal(s->key, "1");
  sf_sample_destroy(&s);
  sf_tar_reader_close(&t);
  /* Hostile Examples refused before protobuf-c unpacks them, or within 8 bytes of memory per byte. */
  /* Four features fields of 10 entries each: protobuf merges them into 40, over the 16 a sample holds. */
  pb ten = {0}, empty = {0}, features = {0};
  for (int i = 0; i < 10; i++) {
    char name[8];
    snprintf(name, sizeof name, "f%d", i);
    pb_entry(&ten, name, 3, &empty);
  }
  for (int i = 0; i < 4; i++) pb_bytes(&features, 1, ten.d, ten.n);
  sf_sample *x = sf_sample_new();
  char why[256];
  assert_int_equal(sf_tfrecord_parse_example(features.d, features.n, NULL, x, why, sizeof why), SF_ETOOBIG);
  assert_non_null(strstr(why, "features"));
  pb pair = {0}, entry = {0};
  pb_bytes(&pair, 1, "a", 1);
  pb_bytes(&pair, 1, "b", 1);
  pb_entry(&entry, "k", 1, &pair);
  memset(&features, 0, sizeof features);
  pb_bytes(&features, 1, entry.d, entry.n);
  assert_int_equal(sf_tfrecord_parse_example(features.d, features.n, NULL, x, why, sizeof why), SF_EUNSUPPORTED);
  size_t big = 200000;
  uint8_t *unknown = malloc(big);
  for (size_t i = 0; i < big; i += 2) unknown[i] = 5 << 3, unknown[i + 1] = 0; /* field 5, varint 0 */
  assert_int_equal(sf_tfrecord_parse_example(unknown, big, NULL, x, why, sizeof why), SF_EFORMAT);
  assert_non_null(strstr(why, "8 times"));
  free(unknown);
  assert_int_equal(x->n_fields, 0);
  sf_sample_destroy(&x);
  /* Over the limits: passed over. */
  t = open_tfrecord(shard, n, "big.tfrecord");
  sf_tar_reader_set_limits(t, 8, 1 << 20);
  assert_int_equal(sf_tar_reader_next(t, &s, &e), SF_ETOOBIG);
  assert_non_null(s);
  sf_sample_destroy(&s);
  sf_tar_reader_close(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grouping),
      cmocka_unit_test(test_key_rules),
      cmocka_unit_test(test_sample_index_and_url_shared),
      cmocka_unit_test(test_skips),
      cmocka_unit_test(test_duplicate_field),
      cmocka_unit_test(test_limits),
      cmocka_unit_test(test_sparse_member),
      cmocka_unit_test(test_member_limits),
      cmocka_unit_test(test_truncated),
      cmocka_unit_test(test_plain_members_as_libarchive),
      cmocka_unit_test(test_not_a_tar),
      cmocka_unit_test(test_filters),
      cmocka_unit_test(test_url_kinds),
      cmocka_unit_test(test_http_stall),
      cmocka_unit_test(test_stage_one_pass),
      cmocka_unit_test(test_stage_samples_per_epoch),
      cmocka_unit_test(test_stage_errors),
      cmocka_unit_test(test_out_of_descriptors),
      cmocka_unit_test(test_crc32c_vectors),
      cmocka_unit_test(test_tfrecord_records),
      cmocka_unit_test(test_tfrecord_damage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
