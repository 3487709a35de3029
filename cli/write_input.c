/* `shardflow write`'s inputs: ImageFolder trees, tars of them, and MNIST IDX files, read into a list of images. */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "cli/cli.h"
#include "cli/write.h"
#include "image.h"
#include "shardflow/error.h"

static int list_push(sf_write_list *l, sf_write_item **out) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 1024;
    sf_write_item *v = realloc(l->v, cap * sizeof *v);
    if (!v) return SF_ENOMEM;
    l->v = v;
    l->cap = cap;
  }
  *out = memset(&l->v[l->n++], 0, sizeof l->v[0]);
  return 0;
}

static int class_push(sf_write_list *l, const char *name, size_t len) {
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

void sf_write_list_free(sf_write_list *l) {
  for (size_t i = 0; i < l->n; i++) {
    free(l->v[i].name);
    sf_buffer_unref(&l->v[i].src);
    sf_buffer_unref(&l->v[i].out);
    sf_tensor_clear(&l->v[i].pixels);
  }
  for (size_t i = 0; i < l->n_classes; i++)
    free(l->classes[i]);
  free(l->v);
  free(l->classes);
}

/* The lower-cased extension of a basename when it names an image we read, else false. */
static bool image_extension(const char *base, char ext[16]) {
  if (base[0] == '.') return false; /* hidden files, as torchvision's ImageFolder skips them */
  const char *dot = strrchr(base, '.');
  if (!dot || strlen(dot + 1) >= 16 || !dot[1]) return false;
  size_t i = 0;
  for (const char *s = dot + 1; *s; s++)
    ext[i++] = (char)((*s >= 'A' && *s <= 'Z') ? *s + 32 : *s);
  ext[i] = 0;
  return sf_image_format_known(ext) != 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int cmp_item(const void *a, const void *b) {
  const sf_write_item *x = a, *y = b;
  if (x->cls != y->cls) return x->cls < y->cls ? -1 : 1;
  return strcmp(x->name + x->class_len, y->name + y->class_len);
}

int sf_write_assign_classes(sf_write_list *l) {
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
    sf_write_item *it = &l->v[i];
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

int sf_write_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = sf_cli_vfail(SF_WRITE_COMMAND, fmt, ap);
  va_end(ap);
  return r;
}

void sf_write_order(size_t *order, size_t n, const sf_write_options *o, int64_t rep) {
  for (size_t i = 0; i < n; i++)
    order[i] = i;
  if (o->no_shuffle) return;
  /* A fresh order per repeat, from the seed alone: the same command writes the same shards. */
  sf_rng rng;
  sf_rng_seed(&rng, sf_seed_mix(o->seed, (uint64_t)rep));
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)sf_rng_below(&rng, i);
    size_t t = order[i - 1];
    order[i - 1] = order[j];
    order[j] = t;
  }
}

int sf_write_read_file(const char *path, sf_buffer **out) {
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
static int walk_class(sf_write_list *l, const char *dir, const char *rel, size_t class_len) {
  DIR *d = opendir(dir);
  if (!d) return sf_write_fail("cannot read directory %s: %s", dir, strerror(errno));
  struct dirent *de;
  int r = 0;
  while (r == 0 && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char path[PATH_MAX], sub[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path ||
        snprintf(sub, sizeof sub, "%s/%s", rel, de->d_name) >= (int)sizeof sub) {
      r = sf_write_fail("path too long: %s/%s", dir, de->d_name);
      break;
    }
    struct stat st;
    if (stat(path, &st) < 0) {
      r = sf_write_fail("cannot stat %s: %s", path, strerror(errno));
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
    sf_write_item *it;
    if (list_push(l, &it) < 0 || !(it->name = strdup(sub))) {
      r = sf_write_fail("out of memory reading %s", dir);
      break;
    }
    it->class_len = class_len;
    memcpy(it->ext, ext, sizeof ext);
    int e = sf_write_read_file(path, &it->src);
    if (e < 0) r = sf_write_fail("cannot read %s: %s (check permissions)", path, strerror(-e));
  }
  closedir(d);
  return r;
}

int sf_write_collect_tree(sf_write_list *l, const char *root) {
  DIR *d = opendir(root);
  if (!d) return sf_write_fail("cannot open input directory %s: %s", root, strerror(errno));
  struct dirent *de;
  char **names = NULL;
  size_t n = 0, cap = 0;
  int r = 0;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char path[PATH_MAX];
    struct stat st;
    if (snprintf(path, sizeof path, "%s/%s", root, de->d_name) >= (int)sizeof path || stat(path, &st) < 0 ||
        !S_ISDIR(st.st_mode))
      continue; /* files at the top are not in a class, ImageFolder ignores them too */
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      char **v = realloc(names, cap * sizeof *v);
      if (!v) {
        r = sf_write_fail("out of memory");
        break;
      }
      names = v;
    }
    if (!(names[n] = strdup(de->d_name))) {
      r = sf_write_fail("out of memory");
      break;
    }
    n++;
  }
  closedir(d);
  if (r == 0) qsort(names, n, sizeof *names, cmp_str);
  for (size_t i = 0; i < n; i++) {
    /* Empty class directories still take an index, as in torchvision's class_to_idx. */
    if (r == 0 && class_push(l, names[i], strlen(names[i])) < 0) r = sf_write_fail("out of memory");
    char path[PATH_MAX];
    if (r == 0 && snprintf(path, sizeof path, "%s/%s", root, names[i]) >= (int)sizeof path)
      r = sf_write_fail("path too long: %s/%s", root, names[i]);
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

int sf_write_collect_archive(sf_write_list *l, const char *file, const char *subdir) {
  struct archive *a = archive_read_new();
  if (!a) return sf_write_fail("out of memory");
  archive_read_support_format_tar(a);
  archive_read_support_filter_gzip(a);
  archive_read_support_filter_zstd(a);
  int r = 0;
  if (archive_read_open_filename(a, file, 1 << 20) != ARCHIVE_OK) {
    r = sf_write_fail(
                    "cannot read %s: %s (INPUT must be a directory, a .tar/.tar.gz/.tar.zst, or "
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
    while (p[0] == '.' && p[1] == '/')
      p += 2;
    while (p[0] == '/')
      p++;
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
        r = sf_write_fail("out of memory");
        break;
      }
      continue;
    }
    const char *base = strrchr(p, '/') + 1;
    char ext[16];
    if (archive_entry_filetype(e) != AE_IFREG || p[0] == '.' || strstr(p, "/.") || !image_extension(base, ext)) {
      l->skipped++;
      continue;
    }
    int64_t size = archive_entry_size(e);
    if (size < 0 || size > (1 << 30)) {
      r = sf_write_fail("%s: member %s has an unreasonable size (%lld bytes)", file,
                      archive_entry_pathname(e), (long long)size);
      break;
    }
    sf_write_item *it;
    if (list_push(l, &it) < 0 || !(it->name = strdup(p)) || !(it->src = sf_buffer_new((size_t)size))) {
      r = sf_write_fail("out of memory reading %s", file);
      break;
    }
    it->class_len = class_len;
    memcpy(it->ext, ext, sizeof ext);
    la_ssize_t got = size ? archive_read_data(a, sf_buffer_data(it->src), (size_t)size) : 0;
    if (got != size) {
      r = sf_write_fail("%s: cannot read member %s: %s (the archive is corrupt or truncated)", file,
                      archive_entry_pathname(e), got < 0 ? archive_error_string(a) : "short read");
      break;
    }
  }
  if (r == 0 && ar != ARCHIVE_EOF)
    r = sf_write_fail("%s: %s (the archive is corrupt or truncated)", file, archive_error_string(a));
  archive_read_free(a);
  if (r == 0 && l->n == 0 && subdir)
    r = sf_write_fail("%s has no images under %s/CLASS/; its top-level entries are:%s", file, subdir,
                    tops);
  else if (r == 0 && l->n == 0)
    r = sf_write_fail(
                    "%s has no images as CLASS/IMAGE; its top-level entries are:%s (pass --subdir NAME to "
                    "read the tree under NAME/)",
                    file, tops);
  return r;
}

static void free_data(void *opaque, uint8_t *data) { free(data); }

/* Reads a whole (optionally gzip'd) file; zlib's gzread passes plain files through. */
static int read_gz(const char *path, sf_buffer **out) {
  gzFile g = gzopen(path, "rb");
  if (!g) return sf_write_fail("cannot open %s: %s", path, strerror(errno ? errno : ENOMEM));
  gzbuffer(g, 1 << 20);
  size_t cap = 1 << 20, len = 0;
  uint8_t *data = malloc(cap);
  int r = data ? 0 : sf_write_fail("out of memory");
  while (r == 0) {
    if (len == cap) {
      uint8_t *v = cap < ((size_t)1 << 34) ? realloc(data, cap * 2) : NULL;
      if (!v) {
        r = sf_write_fail("%s: out of memory (or larger than 16 GiB)", path);
        break;
      }
      data = v;
      cap *= 2;
    }
    int got = gzread(g, data + len, (unsigned)((cap - len) > (1u << 30) ? (1u << 30) : cap - len));
    if (got < 0) {
      int zerr;
      const char *msg = gzerror(g, &zerr);
      r = sf_write_fail("cannot read %s: %s (the file is corrupt or truncated)", path, msg);
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
    return sf_write_fail("out of memory");
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
    return sf_write_fail(
                       "%s is not an IDX %s file (magic %02x%02x%02x%02x, expected 000008%02x); pass "
                       "idx:IMAGES,LABELS with the images file first",
                       path, what, size > 0 ? p[0] : 0, size > 1 ? p[1] : 0, size > 2 ? p[2] : 0, size > 3 ? p[3] : 0,
                       want_ndim);
  if (size < 4 + 4 * (size_t)want_ndim) return sf_write_fail("%s: truncated IDX header", path);
  uint64_t need = 1;
  for (int i = 0; i < want_ndim; i++) {
    dims[i] = be32(p + 4 + 4 * i);
    need *= dims[i];
    if (need > ((uint64_t)1 << 40)) return sf_write_fail("%s: IDX dimensions are implausibly large", path);
  }
  if (size - 4 - 4 * (size_t)want_ndim < need)
    return sf_write_fail("%s: IDX file is truncated (%zu bytes of data, header promises %llu)", path,
                       size - 4 - 4 * (size_t)want_ndim, (unsigned long long)need);
  return 0;
}

int sf_write_collect_idx(sf_write_list *l, const char *images_path, const char *labels_path) {
  sf_buffer *images = NULL, *labels = NULL;
  uint32_t idims[3] = {0}, ldims[3] = {0};
  int r = 0;
  if (r == 0) r = read_gz(images_path, &images);
  if (r == 0) r = idx_header(images_path, images, 3, idims);
  if (r == 0) r = read_gz(labels_path, &labels);
  if (r == 0) r = idx_header(labels_path, labels, 1, ldims);
  if (r == 0 && idims[0] != ldims[0])
    r = sf_write_fail("%s has %u images but %s has %u labels; pass matching files", images_path, idims[0],
                    labels_path, ldims[0]);
  for (uint32_t i = 0; r == 0 && i < idims[0]; i++) {
    sf_write_item *it;
    char name[PATH_MAX + 32];
    snprintf(name, sizeof name, "%s[%u]", images_path, i);
    if (list_push(l, &it) < 0 || !(it->name = strdup(name))) {
      r = sf_write_fail("out of memory");
      break;
    }
    it->cls = sf_buffer_data(labels)[8 + i];
    strcpy(it->ext, "pgm");
    int64_t shape[3] = {idims[1], idims[2], 1};
    size_t off = 16 + (size_t)i * idims[1] * idims[2];
    if (sf_tensor_view(&it->pixels, SF_DTYPE_UINT8, 3, shape, sf_buffer_ref(images), off) < 0)
      r = sf_write_fail("%s: image %u lies outside the file", images_path, i);
  }
  sf_buffer_unref(&images);
  sf_buffer_unref(&labels);
  return r;
}
