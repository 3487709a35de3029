/* `shardflow write` of any fields: a directory of KEY.EXT files or a JSON-lines manifest, written as they are. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "cli/write.h"

bool sf_write_fields_input(const sf_write_options *o) {
  size_t n = strlen(o->input);
  return o->layout == SF_WRITE_FILES || (n > 6 && strcmp(o->input + n - 6, ".jsonl") == 0);
}

/*
 * Why text cannot be part of a member name, or NULL: bytes that are not UTF-8, or a control character
 * (C0, DEL, C1, a bidirectional override): as a member name a newline forges lines of a listing and an
 * escape sequence acts on the terminal of whoever lists or extracts the shard. why[size] holds the reason.
 */
static const char *text_problem(const char *text, char *why, size_t size) {
  const unsigned char *p = (const unsigned char *)text;
  size_t n = strlen(text);
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t len = sf_cli_utf8_next(p + i, n - i, &cp);
    if (len == 0) {
      snprintf(why, size, "is not UTF-8 (byte 0x%02x at offset %zu)", p[i], i);
      return why;
    }
    if (cp < 0x20 || cp == 0x7f || sf_cli_is_format_control(cp)) {
      snprintf(why, size, "holds the control character U+%04X at offset %zu", (unsigned)cp, i);
      return why;
    }
    i += len;
  }
  return NULL;
}

/*
 * Why key cannot be a sample's __key__, or NULL. A '/' inside is a WebDataset key naming a subdirectory
 * (train/0001); what a tar extractor would place outside its target directory, or where the key would
 * not read back as written, is refused.
 */
static const char *key_problem(const char *key, char *why, size_t size) {
  if (!key[0]) return "is empty";
  if (key[0] == '/')
    return "starts with '/' (an absolute member path, which tar extractors may write outside their target)";
  if (strchr(key, '.'))
    return "holds a dot (the key runs to the first dot of a member's name; a '..' component would also climb "
           "out of an extraction directory)";
  if (strstr(key, "//") || key[strlen(key) - 1] == '/') return "has an empty path component ('//' or a trailing '/')";
  return text_problem(key, why, size);
}

/* With --root: path resolved (symlinks, "..") into resolved[PATH_MAX], which must lie under root. Returns
 * 0, or prints what is wrong (where: the manifest line or the directory) and returns 1. */
static int resolve_under_root(const char *root, const char *path, char *resolved, const char *where) {
  char shown[PATH_MAX];
  sf_cli_escape(path, shown, sizeof shown);
  if (!realpath(path, resolved))
    return sf_write_fail("%s: cannot resolve %s: %s", where, shown, strerror(errno));
  size_t len = strlen(root);
  bool under = strncmp(resolved, root, len) == 0 && (resolved[len] == '/' || (len == 1 && root[0] == '/'));
  if (under) return 0;
  char real[PATH_MAX];
  sf_cli_escape(resolved, real, sizeof real);
  return sf_write_fail(
                     "%s: %s resolves to %s, outside --root %s (an input may only name files under --root, "
                     "also through symlinks and '..')",
                     where, shown, real, root);
}

/* The last sample when join and it has this key, else a new one at the end. */
static sf_write_sample *sample_for(sf_write_samples *s, const char *key, size_t len, bool join) {
  if (join && s->n && strlen(s->v[s->n - 1].key) == len && strncmp(s->v[s->n - 1].key, key, len) == 0)
    return &s->v[s->n - 1];
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    sf_write_sample *v = realloc(s->v, cap * sizeof *v);
    if (!v) return NULL;
    s->v = v, s->cap = cap;
  }
  sf_write_sample *out = &s->v[s->n];
  memset(out, 0, sizeof *out);
  if (!(out->key = strndup(key, len))) return NULL;
  s->n++;
  return out;
}

/* Adds a member; takes *bytes (may be NULL) and copies field and path. Returns false when out of memory. */
static bool add_member(sf_write_sample *sample, const char *field, const char *path, sf_buffer **bytes) {
  sf_write_member *m = realloc(sample->members, (sample->n + 1) * sizeof *m);
  if (!m) return false;
  sample->members = m;
  m = &m[sample->n];
  m->field = strdup(field);
  m->path = path ? strdup(path) : NULL;
  m->bytes = bytes ? *bytes : NULL;
  if (bytes) *bytes = NULL;
  sample->n++;
  return m->field && (m->path || !path);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int cmp_member(const void *a, const void *b) {
  return strcmp(((const sf_write_member *)a)->field, ((const sf_write_member *)b)->field);
}

/* DIR/KEY.EXT: names sorted by (KEY, EXT); KEY is up to the first dot, as tar_split splits it. root: the
 * resolved --root, or NULL. */
static int collect_files(sf_write_samples *s, const char *dir, const char *root) {
  DIR *d = opendir(dir);
  if (!d)
    return sf_write_fail("cannot read directory %s: %s (--layout files reads DIR/KEY.EXT)", dir,
                       strerror(errno));
  char **names = NULL;
  size_t n = 0, cap = 0;
  int r = 0;
  struct dirent *de;
  while (r == 0 && (de = readdir(d))) {
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    if (de->d_name[0] == '.' || stat(path, &st) < 0 || !S_ISREG(st.st_mode)) continue;
    const char *dot = strchr(de->d_name, '.');
    if (!dot || !dot[1]) {
      s->skipped++;
      continue;
    }
    char why[96];
    if (text_problem(de->d_name, why, sizeof why)) {
      char shown[PATH_MAX];
      sf_cli_escape(path, shown, sizeof shown);
      r = sf_write_fail("%s: the name %s (it becomes the member's name); rename the file", shown, why);
      break;
    }
    if (n == cap) {
      char **v = realloc(names, (cap = cap ? 2 * cap : 256) * sizeof *v);
      if (!v)
        r = sf_write_fail("out of memory");
      else
        names = v;
    }
    /* The dot becomes NUL: sorting "KEY\0EXT" sorts by key, then field. */
    if (r == 0 && !(names[n++] = strdup(de->d_name))) r = sf_write_fail("out of memory");
    if (r == 0) *strchr(names[n - 1], '.') = '\0';
  }
  closedir(d);
  if (r == 0) qsort(names, n, sizeof *names, cmp_name);
  for (size_t i = 0; r == 0 && i < n; i++) {
    size_t klen = strlen(names[i]);
    char path[PATH_MAX], resolved[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.%s", dir, names[i], names[i] + klen + 1);
    if (root && (r = resolve_under_root(root, path, resolved, dir)) != 0) break;
    if (root) memcpy(path, resolved, sizeof path);
    sf_write_sample *sample = sample_for(s, names[i], klen, true);
    if (!sample || !add_member(sample, names[i] + klen + 1, path, NULL))
      r = sf_write_fail("out of memory");
  }
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
  if (r == 0 && s->n == 0) r = sf_write_fail("%s has no KEY.EXT files", dir);
  return r;
}

/* One manifest value: a file path (string), or {"inline": V}. Returns 0 or prints what is wrong and returns 1. */
static int manifest_member(sf_write_sample *sample, const char *field, json_t *v, const char *base, const char *where,
                           const char *root) {
  if (json_is_string(v)) {
    const char *p = json_string_value(v);
    char path[PATH_MAX], resolved[PATH_MAX], shown[PATH_MAX];
    snprintf(path, sizeof path, "%s%s", p[0] == '/' ? "" : base, p);
    sf_cli_escape(path, shown, sizeof shown);
    struct stat st;
    if (access(path, R_OK) < 0 || stat(path, &st) < 0)
      return sf_write_fail("%s: field %s: cannot read %s: %s (paths are relative to the manifest)", where,
                         field, shown, strerror(errno));
    if (!S_ISREG(st.st_mode))
      return sf_write_fail("%s: field %s: %s is not a regular file", where, field, shown);
    if (root && resolve_under_root(root, path, resolved, where) != 0) return 1;
    return add_member(sample, field, root ? resolved : path, NULL) ? 0 : sf_write_fail("out of memory");
  }
  json_t *in = json_is_object(v) && json_object_size(v) == 1 ? json_object_get(v, "inline") : NULL;
  if (!in)
    return sf_write_fail("%s: field %s: give a file path (a string) or {\"inline\": VALUE}", where, field);
  char *text = json_is_string(in) ? NULL : json_dumps(in, JSON_COMPACT | JSON_ENCODE_ANY);
  const char *data = json_is_string(in) ? json_string_value(in) : text;
  size_t len = json_is_string(in) ? json_string_length(in) : text ? strlen(text) : 0;
  sf_buffer *b = data ? sf_buffer_new(len) : NULL;
  if (b) memcpy(sf_buffer_data(b), data, len);
  free(text);
  if (!b || !add_member(sample, field, NULL, &b)) {
    sf_buffer_unref(&b);
    return sf_write_fail("out of memory");
  }
  return 0;
}

static int collect_manifest(sf_write_samples *s, const char *manifest, const char *root) {
  FILE *f = fopen(manifest, "r");
  if (!f) return sf_write_fail("cannot open manifest %s: %s", manifest, strerror(errno));
  char base[PATH_MAX];
  const char *slash = strrchr(manifest, '/');
  snprintf(base, sizeof base, "%.*s", slash ? (int)(slash - manifest + 1) : 0, manifest);
  char *line = NULL;
  size_t cap = 0;
  int r = 0;
  for (long lineno = 1; r == 0 && getline(&line, &cap, f) >= 0; lineno++) {
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "%s:%ld", manifest, lineno);
    if (line[strspn(line, " \t\r\n")] == '\0') continue;
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    const char *key = o ? json_string_value(json_object_get(o, "__key__")) : NULL;
    char why[96];
    const char *problem = key ? key_problem(key, why, sizeof why) : NULL;
    if (!o)
      r = sf_write_fail("%s: column %d: %s", where, je.column, je.text);
    else if (!key)
      r = sf_write_fail("%s: give \"__key__\" as a non-empty string without dots", where);
    else if (problem)
      r = sf_write_fail("%s: \"__key__\" %s; a key becomes the member names' path", where, problem);
    sf_write_sample *sample = r == 0 ? sample_for(s, key, strlen(key), false) : NULL;
    if (r == 0 && !sample) r = sf_write_fail("out of memory");
    const char *field;
    json_t *v;
    json_object_foreach(o, field, v) {
      if (r != 0 || strcmp(field, "__key__") == 0) continue;
      char shown[512];
      sf_cli_escape(field, shown, sizeof shown);
      if (!field[0] || field[0] == '_' || strchr(field, '/'))
        r = sf_write_fail("%s: field name '%s' is not a member extension (e.g. jpg, txt, seg.png)", where,
                        shown);
      else if ((problem = text_problem(field, why, sizeof why)))
        r = sf_write_fail("%s: field name '%s' %s; a field name becomes part of a member name", where,
                        shown, problem);
      else
        r = manifest_member(sample, field, v, base, where, root);
    }
    if (r == 0 && sample->n == 0) r = sf_write_fail("%s: sample %s has no fields", where, key);
    if (r == 0) qsort(sample->members, sample->n, sizeof sample->members[0], cmp_member);
    json_decref(o);
  }
  free(line);
  fclose(f);
  if (r == 0 && s->n == 0) r = sf_write_fail("manifest %s has no samples", manifest);
  /* tar_split joins consecutive members of one key: a key given twice would merge or split samples. */
  char **keys = r == 0 ? malloc(s->n * sizeof *keys) : NULL;
  if (r == 0 && !keys) r = sf_write_fail("out of memory");
  for (size_t i = 0; keys && i < s->n; i++)
    keys[i] = s->v[i].key;
  if (keys) qsort(keys, s->n, sizeof *keys, cmp_name);
  for (size_t i = 1; keys && r == 0 && i < s->n; i++)
    if (strcmp(keys[i - 1], keys[i]) == 0)
      r = sf_write_fail("manifest %s: key %s appears on more than one line", manifest, keys[i]);
  free(keys);
  return r;
}

int sf_write_collect_samples(sf_write_samples *s, const sf_write_options *o) {
  struct stat st;
  if (stat(o->input, &st) < 0) return sf_write_fail("cannot open INPUT %s: %s", o->input, strerror(errno));
  if (o->subdir) return sf_write_fail("--subdir applies to ImageFolder inputs, not to %s", o->input);
  if (o->layout == SF_WRITE_FILES && !S_ISDIR(st.st_mode))
    return sf_write_fail("--layout files reads a directory of KEY.EXT files; %s is not one", o->input);
  char root[PATH_MAX];
  struct stat rst;
  const char *bad = NULL;
  if (o->root && !realpath(o->root, root))
    bad = strerror(errno);
  else if (o->root && (stat(root, &rst) < 0 || !S_ISDIR(rst.st_mode)))
    bad = "not a directory";
  if (bad)
    return sf_write_fail("--root %s: %s (give the directory every input file must lie under)", o->root,
                       bad);
  return S_ISDIR(st.st_mode) ? collect_files(s, o->input, o->root ? root : NULL)
                             : collect_manifest(s, o->input, o->root ? root : NULL);
}

int sf_write_samples_write(const sf_write_samples *s, const sf_write_options *o, sf_tar_writer *w, sf_error *err) {
  size_t *order = malloc((s->n ? s->n : 1) * sizeof *order);
  if (!order) return sf_error_set(err, SF_ENOMEM, SF_NOWHERE, "out of memory");
  int r = 0;
  for (int64_t rep = 0; r == 0 && rep < o->repeat; rep++) {
    sf_write_order(order, s->n, o, rep);
    for (size_t i = 0; r == 0 && i < s->n; i++) {
      const sf_write_sample *sample = &s->v[order[i]];
      sf_tar_field *fields = calloc(sample->n, sizeof *fields);
      sf_buffer **read = calloc(sample->n, sizeof *read);
      if (!fields || !read) r = sf_error_set(err, SF_ENOMEM, SF_NOWHERE, "out of memory");
      for (size_t k = 0; r == 0 && k < sample->n; k++) {
        const sf_write_member *m = &sample->members[k];
        sf_buffer *b = m->bytes;
        if (m->path && (r = sf_write_read_file(m->path, &read[k])) < 0)
          r = sf_error_set(err, SF_EIO, SF_AT(.url = m->path), "cannot read %s: %s", m->path, strerror(-r));
        else if (m->path)
          b = read[k];
        if (r == 0) fields[k] = (sf_tar_field){m->field, sf_buffer_data(b), sf_buffer_size(b)};
      }
      if (r == 0) r = sf_tar_writer_add(w, sample->key, fields, (int)sample->n, err);
      for (size_t k = 0; read && k < sample->n; k++)
        sf_buffer_unref(&read[k]);
      free(read);
      free(fields);
    }
  }
  free(order);
  return r;
}

void sf_write_samples_free(sf_write_samples *s) {
  for (size_t i = 0; i < s->n; i++) {
    for (size_t k = 0; k < s->v[i].n; k++) {
      free(s->v[i].members[k].field);
      free(s->v[i].members[k].path);
      sf_buffer_unref(&s->v[i].members[k].bytes);
    }
    free(s->v[i].members);
    free(s->v[i].key);
  }
  free(s->v);
  memset(s, 0, sizeof *s);
}
