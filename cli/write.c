/* shardflow write: packs an ImageFolder tree, a tar of one, or MNIST IDX files into WebDataset shards. */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "engine/files.h"
#include "cli/cli.h"
#include "engine/image.h"
#include "engine/options.h"
#include "shardflow/stage.h"
#include "shardflow/storage.h"

enum out_format { FMT_PPM, FMT_PNG, FMT_JPG, FMT_ORIG };

/* The output pattern split around its one %d conversion, so no user text is ever a format. */
typedef struct pattern {
  char prefix[1024];
  char suffix[1024];
  int width;
  bool zero;
} pattern;

typedef struct write_options {
  int format; /* enum out_format */
  int64_t quality;
  int64_t maxcount;
  int64_t maxsize;
  int64_t repeat;
  int64_t start_index;
  uint64_t seed;
  bool no_shuffle;
  int64_t jobs;
  bool quiet;
  const char *subdir;
  const char *input;
  pattern out;
} write_options;

static const char *const format_names[] = {[FMT_PPM] = "ppm", [FMT_PNG] = "png", [FMT_JPG] = "jpg",
                                           [FMT_ORIG] = "orig", NULL};

static const sf_cli_option write_options_table[] = {
    {.row = {"format", SF_OPT_ENUM, offsetof(write_options, format), "ppm",
      .help = "image field: ppm decodes to binary P6 .ppm (.pgm for gray IDX images); png/jpg re-encode; "
              "orig keeps the source bytes and extension", .enum_names = format_names}, .value = "FORMAT"},
    {.row = {"quality", SF_OPT_INT, offsetof(write_options, quality), "95", 1, 100, "JPEG quality for --format jpg"}, .value = "Q"},
    {.row = {"maxcount", SF_OPT_COUNT, offsetof(write_options, maxcount), "2000", 1, 1e15, "samples per shard"}, .value = "N"},
    {.row = {"maxsize", SF_OPT_SIZE, offsetof(write_options, maxsize), "3G", 1, 1e18,
      "start a new shard before one would exceed this many bytes (k, M, G = 1000^n; Ki, MiB, GiB = 1024^n)"}, .value = "BYTES"},
    {.row = {"repeat", SF_OPT_COUNT, offsetof(write_options, repeat), "1", 1, 1e6, "write the whole set N times"}, .value = "N"},
    {.row = {"shuffle-seed", SF_OPT_SEED, offsetof(write_options, seed), "0", .help = "seed of the sample order"}, .value = "S"},
    {.row = {"no-shuffle", SF_OPT_BOOL, offsetof(write_options, no_shuffle),
      .help = "keep the input order (ImageFolder: class-sorted; IDX: file order). By default every repeat is "
              "written in a fresh seeded random order, so each shard mixes classes."}},
    {.row = {"start-index", SF_OPT_COUNT, offsetof(write_options, start_index), "0", 0, 1e15,
      "key of the first sample"}, .value = "N"},
    {.row = {"subdir", SF_OPT_STRING, offsetof(write_options, subdir), .help = "read the tree under NAME/ (e.g. train, test)"}, .value = "NAME"},
    {.row = {"jobs", SF_OPT_INT, offsetof(write_options, jobs), NULL, 1, 1024, "decode threads (default: online CPUs)"}, .value = "N"},
    {.row = {"quiet", SF_OPT_BOOL, offsetof(write_options, quiet), .help = "no summary"}, .short_name = 'q'},
    {.row = {NULL}},
};

/* One distinct image: its source, its class, and (after encoding) the bytes every repeat writes. */
typedef struct image_item {
  char *name;          /* for messages and sorting: "CLASS/REST" (tree) or "FILE[i]" (IDX) */
  size_t class_len;    /* length of CLASS in name (tree inputs) */
  int cls;
  char ext[16];        /* lower-case source extension ("jpg", "png"...) */
  sf_buffer *src;      /* encoded source bytes (tree inputs), freed after encoding */
  sf_tensor pixels;    /* IDX: uint8 [H, W, 1] view of the images file */
  sf_buffer *out;      /* the <format> member's bytes */
  const char *out_ext; /* the <format> member's extension (points into ext or a literal) */
} image_item;

typedef struct image_list {
  image_item *v;
  size_t n, cap;
  char **classes;      /* class names, sorted (tree inputs) */
  size_t n_classes, cap_classes;
  size_t skipped;      /* files that are not images we read */
} image_list;

static void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("shardflow write: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs("\n(see shardflow write --help)\n", stderr);
  exit(2);
}

/* Prints "shardflow write: ..." and returns exit status 1, for run-time failures. */
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("shardflow write: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return 1;
}

/* ---------- the output pattern ---------- */

/* Splits OUTPUT_PATTERN around exactly one %d / %0Nd conversion; "%%" is a literal percent. */
static void parse_pattern(const char *text, pattern *p) {
  memset(p, 0, sizeof *p);
  char *dst = p->prefix;
  size_t len = 0;
  int conversions = 0;
  for (const char *s = text; *s; s++) {
    if (*s == '%' && s[1] == '%') {
      s++;
    } else if (*s == '%') {
      const char *q = s + 1;
      bool zero = *q == '0';
      if (zero) q++;
      int width = 0;
      while (*q >= '0' && *q <= '9' && width < 100) width = width * 10 + (*q++ - '0');
      if (*q != 'd' || width >= 100)
        die_usage("OUTPUT_PATTERN '%s' may contain only %%d or %%0Nd conversions (write %%%% for a "
                  "literal %%)",
                  text);
      if (++conversions > 1)
        die_usage("OUTPUT_PATTERN '%s' has more than one %%d conversion; it needs exactly one", text);
      p->zero = zero;
      p->width = width;
      dst[len] = 0;
      dst = p->suffix;
      len = 0;
      s = q;
      continue;
    }
    if (len + 1 >= sizeof p->prefix) die_usage("OUTPUT_PATTERN is too long");
    dst[len++] = *s;
  }
  dst[len] = 0;
  if (conversions != 1)
    die_usage("OUTPUT_PATTERN '%s' needs one %%d conversion for the shard number, e.g. "
              "out/train-%%06d.tar",
              text);
}

static void shard_path(const pattern *p, int64_t shard, char *out, size_t size) {
  if (p->zero)
    snprintf(out, size, "%s%0*lld%s", p->prefix, p->width, (long long)shard, p->suffix);
  else
    snprintf(out, size, "%s%*lld%s", p->prefix, p->width, (long long)shard, p->suffix);
}

/* ---------- collecting images ---------- */

static int list_push(image_list *l, image_item **out) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 1024;
    image_item *v = realloc(l->v, cap * sizeof *v);
    if (!v) return SF_ENOMEM;
    l->v = v;
    l->cap = cap;
  }
  *out = memset(&l->v[l->n++], 0, sizeof l->v[0]);
  return 0;
}

static int class_push(image_list *l, const char *name, size_t len) {
  if (l->n_classes == l->cap_classes) {
    size_t cap = l->cap_classes ? l->cap_classes * 2 : 64;
    char **v = realloc(l->classes, cap * sizeof *v);
    if (!v) return SF_ENOMEM;
    l->classes = v;
    l->cap_classes = cap;
  }
  if (!(l->classes[l->n_classes] = strndup(name, len))) return SF_ENOMEM;
  l->n_classes++;
  return 0;
}

static void list_free(image_list *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].name);
    sf_buffer_unref(&l->v[i].src);
    sf_buffer_unref(&l->v[i].out);
    sf_tensor_clear(&l->v[i].pixels);
  }
  for (size_t i = 0; i < l->n_classes; i++) free(l->classes[i]);
  free(l->v);
  free(l->classes);
}

/* The lower-cased extension of a basename when it names an image we read, else false. */
static bool image_extension(const char *base, char ext[16]) {
  if (base[0] == '.') return false; /* hidden files, as torchvision's ImageFolder skips them */
  const char *dot = strrchr(base, '.');
  if (!dot || strlen(dot + 1) >= 16 || !dot[1]) return false;
  size_t i = 0;
  for (const char *s = dot + 1; *s; s++) ext[i++] = (char)((*s >= 'A' && *s <= 'Z') ? *s + 32 : *s);
  ext[i] = 0;
  return sf_image_format_known(ext) != 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_item(const void *a, const void *b) {
  const image_item *x = a, *y = b;
  if (x->cls != y->cls) return x->cls < y->cls ? -1 : 1;
  return strcmp(x->name + x->class_len, y->name + y->class_len);
}

/*
 * Sorts and deduplicates the class names, gives every image the index of its
 * class, and orders images by (class, path): the ImageFolder order.
 */
static int assign_classes(image_list *l) {
  for (size_t i = 0; i < l->n; i++)
    if (class_push(l, l->v[i].name, l->v[i].class_len) < 0) return SF_ENOMEM;
  if (l->n_classes == 0) return 0;
  qsort(l->classes, l->n_classes, sizeof l->classes[0], cmp_str);
  size_t u = 1;
  for (size_t i = 1; i < l->n_classes; i++) {
    if (strcmp(l->classes[i], l->classes[u - 1]) == 0)
      free(l->classes[i]);
    else
      l->classes[u++] = l->classes[i];
  }
  l->n_classes = u;
  for (size_t i = 0; i < l->n; i++) {
    image_item *it = &l->v[i];
    char save = it->name[it->class_len];
    it->name[it->class_len] = 0;
    const char *key = it->name;
    char **hit = bsearch(&key, l->classes, l->n_classes, sizeof l->classes[0], cmp_str);
    it->name[it->class_len] = save;
    it->cls = (int)(hit - l->classes);
  }
  qsort(l->v, l->n, sizeof l->v[0], cmp_item);
  return 0;
}

static int read_file(const char *path, sf_buffer **out) {
  FILE *f = fopen(path, "rb");
  if (!f) return -errno;
  struct stat st;
  if (fstat(fileno(f), &st) < 0 || st.st_size < 0) {
    int e = errno;
    fclose(f);
    return -e;
  }
  sf_buffer *b = sf_buffer_new((size_t)st.st_size);
  if (!b) {
    fclose(f);
    return -ENOMEM;
  }
  size_t got = fread(sf_buffer_data(b), 1, (size_t)st.st_size, f);
  int e = ferror(f) ? EIO : 0;
  fclose(f);
  if (e || got != (size_t)st.st_size) {
    sf_buffer_unref(&b);
    return e ? -e : -EIO;
  }
  *out = b;
  return 0;
}

/* Adds every image below dir (recursively, as torchvision's os.walk does); rel is "CLASS/...". */
static int walk_class(image_list *l, const char *dir, const char *rel, size_t class_len) {
  DIR *d = opendir(dir);
  if (!d) return fail("cannot read directory %s: %s", dir, strerror(errno));
  struct dirent *de;
  int r = 0;
  while (r == 0 && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char path[PATH_MAX], sub[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path ||
        snprintf(sub, sizeof sub, "%s/%s", rel, de->d_name) >= (int)sizeof sub) {
      r = fail("path too long: %s/%s", dir, de->d_name);
      break;
    }
    struct stat st;
    if (stat(path, &st) < 0) {
      r = fail("cannot stat %s: %s", path, strerror(errno));
      break;
    }
    if (S_ISDIR(st.st_mode)) {
      r = walk_class(l, path, sub, class_len);
      continue;
    }
    char ext[16];
    if (!S_ISREG(st.st_mode) || !image_extension(de->d_name, ext)) {
      l->skipped++;
      continue;
    }
    image_item *it;
    if (list_push(l, &it) < 0 || !(it->name = strdup(sub))) {
      r = fail("out of memory reading %s", dir);
      break;
    }
    it->class_len = class_len;
    memcpy(it->ext, ext, sizeof ext);
    int e = read_file(path, &it->src);
    if (e < 0) r = fail("cannot read %s: %s (check permissions)", path, strerror(-e));
  }
  closedir(d);
  return r;
}

static int collect_tree(image_list *l, const char *root) {
  DIR *d = opendir(root);
  if (!d) return fail("cannot open input directory %s: %s", root, strerror(errno));
  struct dirent *de;
  char **names = NULL;
  size_t n = 0, cap = 0;
  int r = 0;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char path[PATH_MAX];
    struct stat st;
    if (snprintf(path, sizeof path, "%s/%s", root, de->d_name) >= (int)sizeof path ||
        stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
      continue; /* files at the top are not in a class, ImageFolder ignores them too */
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      char **v = realloc(names, cap * sizeof *v);
      if (!v) {
        r = fail("out of memory");
        break;
      }
      names = v;
    }
    if (!(names[n] = strdup(de->d_name))) {
      r = fail("out of memory");
      break;
    }
    n++;
  }
  closedir(d);
  if (r == 0) qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n; i++) {
    /* Empty class directories still take an index, as in torchvision's class_to_idx. */
    if (r == 0 && class_push(l, names[i], strlen(names[i])) < 0) r = fail("out of memory");
    char path[PATH_MAX];
    if (r == 0 && snprintf(path, sizeof path, "%s/%s", root, names[i]) >= (int)sizeof path)
      r = fail("path too long: %s/%s", root, names[i]);
    if (r == 0) r = walk_class(l, path, names[i], strlen(names[i]));
    free(names[i]);
  }
  free(names);
  return r;
}

/* Remembers up to a few top-level names of an archive, for the "did you mean --subdir" hint. */
static void note_top(char *tops, size_t size, const char *path) {
  size_t len = strcspn(path, "/");
  if (len == 0 || len > 64) return;
  for (const char *s = tops; *s;) {
    size_t l = strcspn(s, ",");
    if (l == len + 1 && memcmp(s + 1, path, len) == 0) return;
    s += l;
    if (*s) s++;
  }
  size_t used = strlen(tops);
  if (used + len + 3 < size) snprintf(tops + used, size - used, "%s %.*s", used ? "," : "", (int)len, path);
}

static int collect_archive(image_list *l, const char *file, const char *subdir) {
  struct archive *a = archive_read_new();
  if (!a) return fail("out of memory");
  archive_read_support_format_tar(a);
  archive_read_support_filter_gzip(a);
  archive_read_support_filter_zstd(a);
  int r = 0;
  if (archive_read_open_filename(a, file, 1 << 20) != ARCHIVE_OK) {
    r = fail("cannot read %s: %s (INPUT must be a directory, a .tar/.tar.gz/.tar.zst, or "
             "idx:IMAGES,LABELS)",
             file, archive_error_string(a));
    archive_read_free(a);
    return r;
  }
  size_t sublen = subdir ? strlen(subdir) : 0;
  char tops[256] = "";
  struct archive_entry *e;
  int ar;
  while ((ar = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
    const char *p = archive_entry_pathname(e);
    if (!p) continue;
    while (p[0] == '.' && p[1] == '/') p += 2;
    while (p[0] == '/') p++;
    note_top(tops, sizeof tops, p);
    if (subdir) {
      if (strncmp(p, subdir, sublen) != 0 || p[sublen] != '/') continue;
      p += sublen + 1;
    }
    const char *slash = strchr(p, '/');
    if (!slash || slash == p) continue;
    size_t class_len = (size_t)(slash - p);
    if (archive_entry_filetype(e) == AE_IFDIR) {
      if (p[0] != '.' && class_push(l, p, class_len) < 0) {
        r = fail("out of memory");
        break;
      }
      continue;
    }
    const char *base = strrchr(p, '/') + 1;
    char ext[16];
    if (archive_entry_filetype(e) != AE_IFREG || p[0] == '.' || strstr(p, "/.") ||
        !image_extension(base, ext)) {
      l->skipped++;
      continue;
    }
    int64_t size = archive_entry_size(e);
    if (size < 0 || size > (1 << 30)) {
      r = fail("%s: member %s has an unreasonable size (%lld bytes)", file, archive_entry_pathname(e),
               (long long)size);
      break;
    }
    image_item *it;
    if (list_push(l, &it) < 0 || !(it->name = strdup(p)) ||
        !(it->src = sf_buffer_new((size_t)size))) {
      r = fail("out of memory reading %s", file);
      break;
    }
    it->class_len = class_len;
    memcpy(it->ext, ext, sizeof ext);
    la_ssize_t got = size ? archive_read_data(a, sf_buffer_data(it->src), (size_t)size) : 0;
    if (got != size) {
      r = fail("%s: cannot read member %s: %s (the archive is corrupt or truncated)", file,
               archive_entry_pathname(e), got < 0 ? archive_error_string(a) : "short read");
      break;
    }
  }
  if (r == 0 && ar != ARCHIVE_EOF)
    r = fail("%s: %s (the archive is corrupt or truncated)", file, archive_error_string(a));
  archive_read_free(a);
  if (r == 0 && l->n == 0 && subdir)
    r = fail("%s has no images under %s/CLASS/; its top-level entries are:%s", file, subdir, tops);
  else if (r == 0 && l->n == 0)
    r = fail("%s has no images as CLASS/IMAGE; its top-level entries are:%s (pass --subdir NAME to "
             "read the tree under NAME/)",
             file, tops);
  return r;
}

static void free_data(void *opaque, uint8_t *data) { free(data); }

/* Reads a whole (optionally gzip'd) file; zlib's gzread passes plain files through. */
static int read_gz(const char *path, sf_buffer **out) {
  gzFile g = gzopen(path, "rb");
  if (!g) return fail("cannot open %s: %s", path, strerror(errno ? errno : ENOMEM));
  gzbuffer(g, 1 << 20);
  size_t cap = 1 << 20, len = 0;
  uint8_t *data = malloc(cap);
  int r = data ? 0 : fail("out of memory");
  while (r == 0) {
    if (len == cap) {
      uint8_t *v = cap < ((size_t)1 << 34) ? realloc(data, cap * 2) : NULL;
      if (!v) {
        r = fail("%s: out of memory (or larger than 16 GiB)", path);
        break;
      }
      data = v;
      cap *= 2;
    }
    int got = gzread(g, data + len, (unsigned)((cap - len) > (1u << 30) ? (1u << 30) : cap - len));
    if (got < 0) {
      int zerr;
      const char *msg = gzerror(g, &zerr);
      r = fail("cannot read %s: %s (the file is corrupt or truncated)", path, msg);
    } else if (got == 0) {
      break;
    }
    len += (size_t)(got > 0 ? got : 0);
  }
  gzclose(g);
  if (r) {
    free(data);
    return r;
  }
  *out = sf_buffer_wrap(data, len, free_data, NULL);
  if (!*out) {
    free(data);
    return fail("out of memory");
  }
  return 0;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Checks an IDX header (magic 0x0000 08 NDIM: unsigned bytes) and returns its dimensions. */
static int idx_header(const char *path, sf_buffer *b, int want_ndim, uint32_t dims[3]) {
  const uint8_t *p = sf_buffer_data(b);
  size_t size = sf_buffer_size(b);
  const char *what = want_ndim == 3 ? "images" : "labels";
  if (size < 4 || p[0] || p[1] || p[2] != 0x08 || p[3] != want_ndim)
    return fail("%s is not an IDX %s file (magic %02x%02x%02x%02x, expected 000008%02x); pass "
                "idx:IMAGES,LABELS with the images file first",
                path, what, size > 0 ? p[0] : 0, size > 1 ? p[1] : 0, size > 2 ? p[2] : 0,
                size > 3 ? p[3] : 0, want_ndim);
  if (size < 4 + 4 * (size_t)want_ndim) return fail("%s: truncated IDX header", path);
  uint64_t need = 1;
  for (int i = 0; i < want_ndim; i++) {
    dims[i] = be32(p + 4 + 4 * i);
    need *= dims[i];
    if (need > ((uint64_t)1 << 40)) return fail("%s: IDX dimensions are implausibly large", path);
  }
  if (size - 4 - 4 * (size_t)want_ndim < need)
    return fail("%s: IDX file is truncated (%zu bytes of data, header promises %llu)", path,
                size - 4 - 4 * (size_t)want_ndim, (unsigned long long)need);
  return 0;
}

static int collect_idx(image_list *l, const char *spec) {
  const char *comma = strchr(spec, ',');
  if (!comma || comma == spec || !comma[1])
    die_usage("INPUT '%s': write idx:IMAGES.gz,LABELS.gz", spec - 4);
  char *images_path = strndup(spec, (size_t)(comma - spec));
  const char *labels_path = comma + 1;
  sf_buffer *images = NULL, *labels = NULL;
  uint32_t idims[3] = {0}, ldims[3] = {0};
  int r = images_path ? 0 : fail("out of memory");
  if (r == 0) r = read_gz(images_path, &images);
  if (r == 0) r = idx_header(images_path, images, 3, idims);
  if (r == 0) r = read_gz(labels_path, &labels);
  if (r == 0) r = idx_header(labels_path, labels, 1, ldims);
  if (r == 0 && idims[0] != ldims[0])
    r = fail("%s has %u images but %s has %u labels; pass matching files", images_path, idims[0],
             labels_path, ldims[0]);
  for (uint32_t i = 0; r == 0 && i < idims[0]; i++) {
    image_item *it;
    char name[PATH_MAX + 32];
    snprintf(name, sizeof name, "%s[%u]", images_path, i);
    if (list_push(l, &it) < 0 || !(it->name = strdup(name))) {
      r = fail("out of memory");
      break;
    }
    it->cls = sf_buffer_data(labels)[8 + i];
    strcpy(it->ext, "pgm");
    int64_t shape[3] = {idims[1], idims[2], 1};
    size_t off = 16 + (size_t)i * idims[1] * idims[2];
    if (sf_tensor_view(&it->pixels, SF_DTYPE_UINT8, 3, shape, sf_buffer_ref(images), off) < 0)
      r = fail("%s: image %u lies outside the file", images_path, i);
  }
  free(images_path);
  sf_buffer_unref(&images);
  sf_buffer_unref(&labels);
  return r;
}

/* ---------- encoding (threads) ---------- */

typedef struct encode_job {
  image_list *list;
  const write_options *opt;
  atomic_size_t next;
  atomic_bool failed;
  pthread_mutex_t lock;
  char message[1024];
} encode_job;

static int encode_one(const write_options *opt, image_item *it, sf_error *err) {
  if (opt->format == FMT_ORIG && it->src) {
    it->out = sf_buffer_ref(it->src);
    it->out_ext = it->ext;
    sf_buffer_unref(&it->src);
    return 0;
  }
  sf_tensor img;
  int r = 0;
  if (it->src) {
    const char *fmt = strcmp(it->ext, "jpeg") == 0 ? "jpg" : it->ext;
    r = sf_image_decode(fmt, it->src, 0, sf_buffer_size(it->src), SF_IMAGE_RGB, NULL, &img, err);
    if (r < 0) return r;
  } else {
    sf_tensor_ref(&img, &it->pixels);
  }
  const char *fmt = opt->format == FMT_ORIG ? "ppm" : format_names[opt->format];
  if (strcmp(fmt, "ppm") == 0 && img.ndim == 3 && img.shape[2] == 1) fmt = "pgm";
  r = sf_image_encode(fmt, &img, (int)opt->quality, &it->out, err);
  sf_tensor_clear(&img);
  if (r == 0) {
    it->out_ext = fmt;
    sf_buffer_unref(&it->src); /* the encoded bytes are all the repeats need */
    sf_tensor_clear(&it->pixels);
  }
  return r;
}

static void *encode_worker(void *arg) {
  encode_job *job = arg;
  for (;;) {
    size_t i = atomic_fetch_add(&job->next, 1);
    if (i >= job->list->n || atomic_load(&job->failed)) break;
    image_item *it = &job->list->v[i];
    sf_error err = {0};
    int r = encode_one(job->opt, it, &err);
    if (r < 0) {
      pthread_mutex_lock(&job->lock);
      if (!atomic_exchange(&job->failed, true)) {
        const char *src = job->opt->input;
        bool tree = it->class_len > 0;
        snprintf(job->message, sizeof job->message,
                 "%s%s%s: %s (%s)%s", tree ? src : "", tree ? "/" : "", it->name,
                 err.message[0] ? err.message : sf_strerror(r), sf_err_name(r),
                 tree ? "; fix or remove this image and run again" : "");
      }
      pthread_mutex_unlock(&job->lock);
      break;
    }
  }
  return NULL;
}

static int encode_all(image_list *l, const write_options *opt) {
  encode_job job = {.list = l, .opt = opt};
  atomic_init(&job.next, 0);
  atomic_init(&job.failed, false);
  pthread_mutex_init(&job.lock, NULL);
  int n = (int)opt->jobs;
  if ((size_t)n > l->n) n = l->n ? (int)l->n : 1;
  pthread_t *threads = calloc((size_t)n, sizeof *threads);
  int started = 0;
  if (threads)
    for (; started < n; started++)
      if (pthread_create(&threads[started], NULL, encode_worker, &job) != 0) break;
  if (started == 0) encode_worker(&job); /* no threads at all: do the work here */
  for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
  free(threads);
  pthread_mutex_destroy(&job.lock);
  return atomic_load(&job.failed) ? fail("%s", job.message) : 0;
}

/* ---------- writing shards ---------- */

typedef struct shard_writer {
  const write_options *opt;
  struct archive *a;
  struct archive_entry *entry;
  char path[PATH_MAX];
  bool remote;          /* OUTPUT_PATTERN is a URL: each shard goes to a local temporary file, then up */
  char local[PATH_MAX]; /* that temporary file */
  int64_t shard;        /* number of the open shard; shards opened so far */
  int64_t count;        /* samples in the open shard */
  int64_t bytes;        /* tar bytes in the open shard (headers, padding, end blocks) */
  int64_t total_bytes;
  int64_t samples;
} shard_writer;

static int64_t member_bytes(size_t size) { return 512 + ((int64_t)size + 511) / 512 * 512; }

static bool is_url(const char *s) {
  return strncmp(s, "s3://", 5) == 0 || strncmp(s, "gs://", 5) == 0 || strncmp(s, "http://", 7) == 0 ||
         strncmp(s, "https://", 8) == 0;
}

static int close_shard(shard_writer *w) {
  if (!w->a) return 0;
  const char *written = w->remote ? w->local : w->path;
  int r = archive_write_close(w->a) == ARCHIVE_OK
              ? 0
              : fail("cannot write %s: %s (check free disk space)", written, archive_error_string(w->a));
  archive_write_free(w->a);
  w->a = NULL;
  w->total_bytes += w->bytes;
  if (w->remote) {
    /* the same atomic, read-back-checked upload as `shardflow cp` (multipart for large shards) */
    sf_error err;
    if (r == 0 && sf_storage_copy(w->local, w->path, true, &err) < 0) {
      char line[2048];
      r = fail("%s", sf_error_format(&err, line, sizeof line));
    }
    unlink(w->local);
  }
  return r;
}

static int open_shard(shard_writer *w) {
  shard_path(&w->opt->out, w->shard, w->path, sizeof w->path);
  w->remote = is_url(w->path);
  if (w->remote) {
    const char *tmp = getenv("TMPDIR");
    snprintf(w->local, sizeof w->local, "%s/shardflow-write-%d-%lld.tar", tmp && tmp[0] ? tmp : "/tmp",
             (int)getpid(), (long long)w->shard);
  }
  int e = w->remote ? 0 : sf_make_dirs(w->path, true);
  if (e < 0)
    return fail("cannot create the directory for %s: %s (check OUTPUT_PATTERN and permissions)",
                w->path, strerror(-e));
  w->a = archive_write_new();
  if (!w->a) return fail("out of memory");
  /* Plain ustar: every tar reader knows it, and our names and sizes always fit (pax_restricted
   * would write the same headers but clones and charset-converts every entry to decide so). */
  archive_write_set_format_ustar(w->a);
  archive_write_add_filter_none(w->a);
  archive_write_set_bytes_per_block(w->a, 1 << 20);
  archive_write_set_bytes_in_last_block(w->a, 1); /* no padding after the end-of-archive blocks */
  if (archive_write_open_filename(w->a, w->remote ? w->local : w->path) != ARCHIVE_OK)
    return fail("cannot create %s: %s (check the path and permissions)", w->remote ? w->local : w->path,
                archive_error_string(w->a));
  w->shard++;
  w->count = 0;
  w->bytes = 1024; /* end-of-archive blocks */
  return 0;
}

static int add_member(shard_writer *w, const char *name, const void *data, size_t size) {
  struct archive_entry *e = archive_entry_clear(w->entry);
  archive_entry_set_pathname(e, name);
  archive_entry_set_size(e, (la_int64_t)size);
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0644);
  archive_entry_set_mtime(e, 0, 0);
  if (archive_write_header(w->a, e) != ARCHIVE_OK ||
      (size && archive_write_data(w->a, data, size) != (la_ssize_t)size))
    return fail("cannot write %s: %s (check free disk space)", w->path, archive_error_string(w->a));
  w->bytes += member_bytes(size);
  return 0;
}

static int write_sample(shard_writer *w, const image_item *it) {
  char cls[24];
  int cls_len = snprintf(cls, sizeof cls, "%d", it->cls);
  size_t img_size = sf_buffer_size(it->out);
  int64_t need = member_bytes(img_size) + member_bytes((size_t)cls_len);
  const write_options *o = w->opt;
  if (w->a && (w->count >= o->maxcount || w->bytes + need > o->maxsize)) {
    int r = close_shard(w);
    if (r) return r;
  }
  if (!w->a) {
    int r = open_shard(w);
    if (r) return r;
  }
  char name[64];
  long long key = (long long)(o->start_index + w->samples);
  snprintf(name, sizeof name, "%07lld.%s", key, it->out_ext);
  int r = add_member(w, name, sf_buffer_data(it->out), img_size);
  snprintf(name, sizeof name, "%07lld.cls", key);
  if (r == 0) r = add_member(w, name, cls, (size_t)cls_len);
  if (r == 0) {
    w->count++;
    w->samples++;
  }
  return r;
}

static int write_shards(const image_list *l, const write_options *o, shard_writer *w) {
  size_t *order = malloc((l->n ? l->n : 1) * sizeof *order);
  w->entry = archive_entry_new();
  int r = order && w->entry ? 0 : fail("out of memory");
  for (int64_t rep = 0; r == 0 && rep < o->repeat; rep++) {
    for (size_t i = 0; i < l->n; i++) order[i] = i;
    if (!o->no_shuffle) {
      /* A fresh order per repeat, from the seed alone: the same command writes the same shards. */
      sf_rng rng;
      sf_rng_seed(&rng, sf_seed_mix(o->seed, (uint64_t)rep));
      for (size_t i = l->n; i > 1; i--) {
        size_t j = (size_t)sf_rng_below(&rng, i);
        size_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
      }
    }
    for (size_t i = 0; r == 0 && i < l->n; i++) r = write_sample(w, &l->v[order[i]]);
  }
  int c = close_shard(w);
  if (r == 0) r = c;
  archive_entry_free(w->entry);
  free(order);
  return r;
}

/* ---------- the command ---------- */

static int parse_args(int argc, char **argv, write_options *o) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  *o = (write_options){.jobs = cpus > 0 ? (cpus > 256 ? 256 : cpus) : 1};
  int optind, status;
  if (!sf_cli_parse(&sf_cli_write, argc, argv, o, &optind, &status)) exit(status);
  /* GNU getopt moved the operands to the end, so options may follow them too. */
  int operands = argc - optind;
  if (operands != 2) die_usage("expected INPUT and OUTPUT_PATTERN, got %d operand(s)", operands);
  char **ops = argv + optind;
  o->input = ops[0];
  if (o->subdir) {
    size_t len = strlen(o->subdir);
    while (len > 1 && o->subdir[len - 1] == '/') len--;
    static char sub[PATH_MAX];
    if (len == 0 || len >= sizeof sub) die_usage("--subdir: '%s' is not a directory name", o->subdir);
    memcpy(sub, o->subdir, len);
    sub[len] = 0;
    o->subdir = sub;
  }
  parse_pattern(ops[1], &o->out);
  return 0;
}

static int write_main(int argc, char **argv) {
  write_options o;
  parse_args(argc, argv, &o);
  image_list list = {0};
  int r;
  bool idx = strncmp(o.input, "idx:", 4) == 0;
  struct stat st;
  if (idx) {
    if (o.subdir) die_usage("--subdir does not apply to idx: inputs");
    r = collect_idx(&list, o.input + 4);
  } else if (stat(o.input, &st) < 0) {
    r = fail("cannot open INPUT %s: %s (give a directory, a .tar/.tar.gz/.tar.zst or "
             "idx:IMAGES,LABELS)",
             o.input, strerror(errno));
  } else if (S_ISDIR(st.st_mode)) {
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s%s%s", o.input, o.subdir ? "/" : "", o.subdir ? o.subdir : "");
    r = collect_tree(&list, root);
    if (r == 0 && list.n == 0)
      r = fail("%s has no images as CLASS/IMAGE.(jpg|png|ppm|pgm)%s", root,
               o.subdir ? "" : " (pass --subdir NAME to read the tree under NAME/)");
    if (r == 0) r = assign_classes(&list) < 0 ? fail("out of memory") : 0;
  } else {
    r = collect_archive(&list, o.input, o.subdir);
    if (r == 0) r = assign_classes(&list) < 0 ? fail("out of memory") : 0;
  }
  if (r == 0 && list.n == 0) r = fail("%s holds no images", o.input);
  size_t nested = 0;
  for (size_t i = 0; r == 0 && !idx && i < list.n; i++)
    nested += strchr(list.v[i].name + list.v[i].class_len + 1, '/') != NULL;
  if (r == 0 && !idx && list.n > 0 && nested == list.n)
    fprintf(stderr,
            "shardflow write: warning: every image in %s sits below CLASS/SUBDIR/ (classes: %s%s); "
            "if the tree is under a directory, pass --subdir NAME\n",
            o.input, list.classes[0], list.n_classes > 1 ? ", ..." : "");
  else if (r == 0 && !idx && list.n_classes == 1)
    fprintf(stderr,
            "shardflow write: warning: %s has only one class (%s); if the tree sits under a "
            "directory, pass --subdir NAME\n",
            o.input, list.classes[0]);
  if (r == 0) r = encode_all(&list, &o);
  shard_writer w = {.opt = &o};
  if (r == 0) r = write_shards(&list, &o, &w);
  if (r == 0 && !o.quiet) {
    char first[PATH_MAX], last[PATH_MAX];
    shard_path(&o.out, 0, first, sizeof first);
    shard_path(&o.out, w.shard - 1, last, sizeof last);
    printf("wrote %lld shard%s (%s .. %s): %lld samples (%zu images x %lld), %lld bytes",
           (long long)w.shard, w.shard == 1 ? "" : "s", first, last, (long long)w.samples, list.n,
           (long long)o.repeat, (long long)w.total_bytes);
    if (!idx) printf(", %zu classes", list.n_classes);
    if (list.skipped) printf(", %zu non-image files skipped", list.skipped);
    putchar('\n');
  }
  list_free(&list);
  return r ? 1 : 0;
}

const sf_cli_command sf_cli_write = {
    .name = "write",
    .run = write_main,
    .args = "[OPTIONS] INPUT OUTPUT_PATTERN",
    .summary = "create WebDataset shards",
    .about = "Writes WebDataset shards (key %07d, fields <format> and cls) from:\n"
             "  DIR                      an ImageFolder tree DIR/<class>/<image> (class index =\n"
             "                           position of the class name in the sorted class list)\n"
             "  ARCHIVE.tar[.gz|.zst]    a tar of such a tree (see --subdir)\n"
             "  idx:IMAGES,LABELS        MNIST / Fashion-MNIST IDX files (gzip'd or plain)\n"
             "OUTPUT_PATTERN holds one %d conversion for the shard number, e.g.\n"
             "out/cifar-train-%06d.tar (shards are numbered from 0), or a URL such as\n"
             "s3://bucket/train/shard-%06d.tar (s3://, gs://, http(s)://: each shard is written to\n"
             "$TMPDIR, uploaded as by `shardflow cp` and read back, then removed).",
    .options = write_options_table,
};
