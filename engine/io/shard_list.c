/* Shard lists: expands brace patterns ({000..649}, {a,b}), '::' joins and @FILE lists into URLs. */
#include "shard_list.h"

#include "object_store.h"
#include "strbuf.h"
#include "url.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_URLS 10000000u
/* Bounds beyond 18 digits could overflow uint64_t; no shard list needs them. */
#define MAX_DIGITS 18
/* Expansion recurses once per group and nesting level: bound both so a hostile
 * spec cannot exhaust the stack. Real shard lists use one or two groups. */
#define MAX_GROUPS 256
#define MAX_NESTING 32
/* A list file is read with bounded memory, whatever it is (@/dev/zero, an endless pipe). */
#define MAX_LIST_LINE 65536
#define MAX_LIST_FILE (256u << 20)

typedef struct pattern pattern;

/* One piece of a parsed pattern. */
typedef struct part {
  enum { LITERAL, RANGE, LIST } kind;
  char *text; /* LITERAL: unescaped text */
  size_t len;
  uint64_t from, to; /* RANGE: inclusive bounds, counts down when from > to */
  int width;         /* RANGE: zero-padded width, 0 = none */
  pattern **alts;    /* LIST: alternatives, each a pattern of its own */
  size_t n_alts;
} part;

struct pattern {
  part *parts;
  size_t n;
};

typedef struct ctx {
  const char *pattern; /* the pattern being expanded, quoted in messages */
  const char *file;    /* list file the pattern came from, or NULL */
  long line;           /* its line in that file */
  int groups;          /* groups parsed in this pattern */
  sf_error *error;
  sf_shard_list *list;
  sf_strbuf url; /* the URL being assembled */
} ctx;

/* Fills the error record; column is 1-based within the pattern, 0 = none. */
__attribute__((format(printf, 4, 5))) static int fail(ctx *c, int code, size_t column,
                                                       const char *fmt, ...) {
  sf_error *e = c->error;
  if (!e) return code;
  /* Sized so the message always fits in the record: the pieces add up to < 512 bytes. */
  char what[240], where[32] = "", from[96] = "";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  memset(e, 0, sizeof *e);
  e->code = code;
  e->offset = -1;
  e->line = -1;
  if (column) snprintf(where, sizeof where, " at column %zu", column);
  if (c->file) {
    snprintf(e->url, sizeof e->url, "%s", c->file);
    e->line = c->line;
    snprintf(from, sizeof from, " (line %ld of %.60s)", c->line, c->file);
  }
  bool cut = strlen(c->pattern) > 100;
  snprintf(e->message, sizeof e->message, "shard list \"%.100s%s\"%s%s: %s", c->pattern,
           cut ? "..." : "", from, where, what);
  return code;
}

static void pattern_free(pattern *p) {
  if (!p) return;
  for (size_t i = 0; i < p->n; i++) {
    free(p->parts[i].text);
    for (size_t k = 0; k < p->parts[i].n_alts; k++) pattern_free(p->parts[i].alts[k]);
    free(p->parts[i].alts);
  }
  free(p->parts);
  free(p);
}

static part *add_part(pattern *p) {
  part *parts = realloc(p->parts, (p->n + 1) * sizeof *parts);
  if (!parts) return NULL;
  p->parts = parts;
  memset(&parts[p->n], 0, sizeof *parts);
  return &parts[p->n++];
}

static bool special(char ch) { return ch == '{' || ch == '}' || ch == ',' || ch == '\\'; }

/* Literal text s[start, end) with the backslashes that escape braces and commas removed. */
static int add_literal(pattern *p, const char *s, size_t start, size_t end) {
  if (start == end) return 0;
  part *t = add_part(p);
  if (!t) return SF_ENOMEM;
  t->kind = LITERAL;
  t->text = malloc(end - start + 1);
  if (!t->text) return SF_ENOMEM;
  for (size_t i = start; i < end; i++) {
    if (s[i] == '\\' && i + 1 < end && special(s[i + 1])) i++;
    t->text[t->len++] = s[i];
  }
  t->text[t->len] = '\0';
  return 0;
}

/* Index of the '}' closing the '{' at open, or end when there is none. */
static size_t matching(const char *s, size_t open, size_t end) {
  int depth = 0;
  for (size_t i = open; i < end; i++) {
    if (s[i] == '\\') {
      i++;
    } else if (s[i] == '{') {
      depth++;
    } else if (s[i] == '}' && --depth == 0) {
      return i;
    }
  }
  return end;
}

/* Parses one bound of a range; false unless it is 1..MAX_DIGITS decimal digits. */
static bool parse_bound(const char *s, size_t start, size_t end, uint64_t *value) {
  if (start == end || end - start > MAX_DIGITS) return false;
  *value = 0;
  for (size_t i = start; i < end; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    *value = *value * 10 + (uint64_t)(s[i] - '0');
  }
  return true;
}

static int parse(ctx *c, size_t start, size_t end, int depth, pattern **out);

/* The group between the braces at open and close: a list {a,b,c} or a range {A..B}. */
static int parse_group(ctx *c, pattern *p, size_t open, size_t close, int depth) {
  const char *s = c->pattern;
  if (++c->groups > MAX_GROUPS)
    return fail(c, SF_EINVAL, open + 1, "more than %d brace groups in one pattern", MAX_GROUPS);
  if (depth >= MAX_NESTING)
    return fail(c, SF_EINVAL, open + 1, "brace groups nested more than %d deep", MAX_NESTING);
  part *t = add_part(p);
  if (!t) return SF_ENOMEM;
  t->kind = LIST;
  /* Split at the commas outside nested groups. */
  size_t from = open + 1;
  int nested = 0;
  for (size_t i = open + 1; i <= close; i++) {
    if (i < close && s[i] == '\\') {
      i++;
    } else if (i < close && s[i] == '{') {
      nested++;
    } else if (i < close && s[i] == '}') {
      nested--;
    } else if (i == close ? t->n_alts > 0 : (s[i] == ',' && nested == 0)) {
      pattern **alts = realloc(t->alts, (t->n_alts + 1) * sizeof *alts);
      if (!alts) return SF_ENOMEM;
      t->alts = alts;
      t->alts[t->n_alts] = NULL;
      int r = parse(c, from, i, depth + 1, &t->alts[t->n_alts++]);
      if (r) return r;
      from = i + 1;
    }
  }
  if (t->n_alts > 0) return 0;

  if (close == open + 1)
    return fail(c, SF_EINVAL, open + 1,
                "empty brace group {}; write a list {a,b} or a range {000..099}");
  const char *dots = NULL;
  for (size_t i = open + 1; i + 1 < close; i++)
    if (s[i] == '.' && s[i + 1] == '.') {
      dots = s + i;
      break;
    }
  if (!dots)
    return fail(c, SF_EINVAL, open + 1,
                "brace group \"%.*s\" is neither a list {a,b} nor a range {000..099}",
                (int)(close - open + 1), s + open);
  size_t mid = (size_t)(dots - s);
  t->kind = RANGE;
  if (!parse_bound(s, open + 1, mid, &t->from) || !parse_bound(s, mid + 2, close, &t->to))
    return fail(c, SF_EINVAL, open + 1,
                "bad range \"%.*s\": bounds must be whole numbers of 1 to %d digits, "
                "as in {000000..000649}",
                (int)(close - open + 1), s + open, MAX_DIGITS);
  /* bash's rule: a bound written with a leading zero pads every number to the wider bound. */
  size_t w1 = mid - (open + 1), w2 = close - (mid + 2);
  if ((w1 > 1 && s[open + 1] == '0') || (w2 > 1 && s[mid + 2] == '0'))
    t->width = (int)(w1 > w2 ? w1 : w2);
  return 0;
}

/* Parses c->pattern[start, end) into *out (set even on failure, for freeing). */
static int parse(ctx *c, size_t start, size_t end, int depth, pattern **out) {
  const char *s = c->pattern;
  pattern *p = calloc(1, sizeof *p);
  *out = p;
  if (!p) return SF_ENOMEM;
  size_t literal = start;
  for (size_t i = start; i < end; i++) {
    if (s[i] == '\\') {
      i++;
    } else if (s[i] == '}') {
      return fail(c, SF_EINVAL, i + 1, "unbalanced '}'; remove it or add the '{' it closes");
    } else if (s[i] == '{') {
      size_t close = matching(s, i, end);
      if (close == end)
        return fail(c, SF_EINVAL, i + 1, "unbalanced '{'; close the group with '}'");
      int r = add_literal(p, s, literal, i);
      if (!r) r = parse_group(c, p, i, close, depth);
      if (r) return r;
      i = close;
      literal = close + 1;
    }
  }
  return add_literal(p, s, literal, end);
}

/* Number of URLs p expands to, saturated at MAX_URLS + 1. */
static uint64_t count(const pattern *p) {
  const uint64_t cap = MAX_URLS + 1ull;
  uint64_t n = 1;
  for (size_t i = 0; i < p->n; i++) {
    const part *t = &p->parts[i];
    uint64_t k = 1;
    if (t->kind == RANGE) {
      k = (t->from <= t->to ? t->to - t->from : t->from - t->to);
      k = k >= cap ? cap : k + 1;
    } else if (t->kind == LIST) {
      k = 0;
      for (size_t a = 0; a < t->n_alts; a++) {
        k += count(t->alts[a]);
        if (k > cap) k = cap;
      }
    }
    n *= k; /* both factors are at most cap, so this cannot overflow */
    if (n > cap) n = cap;
  }
  return n;
}

/* What follows a list's alternative: the rest of the enclosing patterns. */
typedef struct frame {
  const pattern *p;
  size_t i;
  const struct frame *next;
} frame;

/* Emits every URL of parts i.. of p followed by next, leftmost group varying slowest. */
static int emit(ctx *c, const pattern *p, size_t i, const frame *next) {
  if (i == p->n) {
    if (next) return emit(c, next->p, next->i, next->next);
    char *url = strndup(c->url.data ? c->url.data : "", c->url.len);
    if (!url) return SF_ENOMEM;
    c->list->urls[c->list->count++] = url; /* room was reserved from count() */
    return 0;
  }
  const part *t = &p->parts[i];
  size_t mark = c->url.len;
  int r = 0;
  if (t->kind == LITERAL) {
    r = sf_strbuf_append(&c->url, t->text, t->len);
    if (!r) r = emit(c, p, i + 1, next);
  } else if (t->kind == RANGE) {
    for (uint64_t v = t->from;; v = t->from <= t->to ? v + 1 : v - 1) {
      char num[32];
      int n = snprintf(num, sizeof num, "%0*llu", t->width, (unsigned long long)v);
      sf_strbuf_truncate(&c->url, mark);
      r = sf_strbuf_append(&c->url, num, (size_t)n);
      if (!r) r = emit(c, p, i + 1, next);
      if (r || v == t->to) break;
    }
  } else {
    frame rest = {p, i + 1, next};
    for (size_t a = 0; a < t->n_alts && !r; a++) {
      sf_strbuf_truncate(&c->url, mark);
      r = emit(c, t->alts[a], 0, &rest);
    }
  }
  sf_strbuf_truncate(&c->url, mark);
  return r;
}

static bool is_shard_name(const char *url) {
  static const char *const suffixes[] = {".tar", ".tar.gz", ".tgz", ".tar.zst"};
  size_t n = strlen(url);
  for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
    size_t k = strlen(suffixes[i]);
    if (n > k && strcmp(url + n - k, suffixes[i]) == 0 && url[n - k - 1] != '/') return true;
  }
  return false;
}

static int compare_urls(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/*
 * Replaces every s3:// or gs:// URL from index `from` on that ends in '/' (a prefix) by the shards stored
 * under it: the .tar, .tar.gz, .tgz and .tar.zst objects, sorted by key.
 */
static int expand_prefixes(ctx *c, size_t from) {
  sf_shard_list *list = c->list;
  for (size_t i = from; i < list->count; i++) {
    char *prefix = list->urls[i];
    size_t len = strlen(prefix);
    if (!sf_url_is_store(prefix) || prefix[len - 1] != '/') continue;
    char **found = NULL;
    size_t n = 0;
    sf_error local;
    int r = sf_object_list(prefix, &found, &n, c->error ? c->error : &local);
    if (r) return r;
    size_t kept = 0;
    for (size_t k = 0; k < n; k++) {
      if (is_shard_name(found[k])) found[kept++] = found[k];
      else free(found[k]);
    }
    if (kept > 1) qsort(found, kept, sizeof *found, compare_urls);
    if (kept == 0) {
      free(found);
      c->pattern = prefix;
      r = fail(c, SF_ENOENT, 0, "no .tar, .tar.gz, .tgz or .tar.zst objects under this prefix; check the bucket "
                                "and the prefix (keys are case-sensitive)");
      if (c->error) snprintf(c->error->url, sizeof c->error->url, "%s", prefix);
      return r;
    }
    if (kept - 1 > MAX_URLS - list->count) {
      for (size_t k = 0; k < kept; k++) free(found[k]);
      free(found);
      c->pattern = prefix;
      return fail(c, SF_ETOOBIG, 0, "the prefix holds more than 10,000,000 shards");
    }
    char **urls = realloc(list->urls, (list->count + kept - 1) * sizeof *urls);
    if (!urls) {
      for (size_t k = 0; k < kept; k++) free(found[k]);
      free(found);
      c->pattern = prefix;
      return fail(c, SF_ENOMEM, 0, "out of memory");
    }
    list->urls = urls;
    memmove(&urls[i + kept], &urls[i + 1], (list->count - i - 1) * sizeof *urls);
    memcpy(&urls[i], found, kept * sizeof *urls);
    list->count += kept - 1;
    free(prefix);
    free(found);
    i += kept - 1;
  }
  return 0;
}

/* Expands one brace pattern (no '::', no '@') and appends its URLs to the list. */
static int expand_pattern(ctx *c, const char *text) {
  c->pattern = text;
  c->groups = 0;
  pattern *p = NULL;
  int r = parse(c, 0, strlen(text), 0, &p);
  if (r == SF_ENOMEM) fail(c, r, 0, "out of memory");
  if (!r) {
    uint64_t n = count(p);
    if (n > MAX_URLS - c->list->count) {
      r = fail(c, SF_ETOOBIG, 0,
               "expands to more than 10,000,000 URLs%s; split the data set or list fewer shards",
               c->list->count ? " with the patterns before it" : "");
    } else {
      char **urls = realloc(c->list->urls, (c->list->count + n) * sizeof *urls);
      if (!urls) {
        r = fail(c, SF_ENOMEM, 0, "out of memory");
      } else {
        c->list->urls = urls;
        sf_strbuf_truncate(&c->url, 0);
        size_t from = c->list->count;
        r = emit(c, p, 0, NULL);
        if (r) fail(c, r, 0, "out of memory");
        if (!r) r = expand_prefixes(c, from);
      }
    }
  }
  pattern_free(p);
  return r;
}

enum { LIST_END = -1, LIST_NUL = -2, LIST_LONG_LINE = -3, LIST_TOO_LARGE = -4 };

/*
 * Reads one line of f into line (room for MAX_LIST_LINE bytes and a NUL), without its '\n';
 * *total counts the bytes read so far. Returns its length or a LIST_* code.
 */
static long read_line(FILE *f, char *line, uint64_t *total) {
  long n = 0;
  int ch;
  while ((ch = getc_unlocked(f)) != EOF) {
    if (++*total > MAX_LIST_FILE) return LIST_TOO_LARGE;
    if (ch == '\n') break;
    if (ch == '\0') return LIST_NUL;
    if (n == MAX_LIST_LINE) return LIST_LONG_LINE;
    line[n++] = (char)ch;
  }
  line[n] = '\0';
  return ch == EOF && n == 0 ? LIST_END : n;
}

/* Expands every line of a list file as a pattern ('#' comments and blank lines skipped). */
static int expand_file(ctx *c, const char *path) {
  c->pattern = path - 1; /* "@path", for messages about the file itself */
  if (!*path) return fail(c, SF_EINVAL, 2, "'@' needs a file name, as in @shards.txt");
  FILE *f = fopen(path, "r");
  if (!f) {
    int r = fail(c, errno == ENOENT ? SF_ENOENT : SF_EIO, 0,
                 "cannot open the list file: %s; check the path after '@'", strerror(errno));
    if (c->error) snprintf(c->error->url, sizeof c->error->url, "%s", path);
    return r;
  }
  char *line = malloc(MAX_LIST_LINE + 1);
  if (!line) {
    fclose(f);
    return fail(c, SF_ENOMEM, 0, "out of memory");
  }
  long n;
  uint64_t total = 0;
  int r = 0;
  c->file = path;
  c->line = 0;
  flockfile(f);
  while (!r && (n = read_line(f, line, &total)) >= 0) {
    c->line++;
    char *s = line, *e = line + n;
    while (s < e && (*s == ' ' || *s == '\t')) s++;
    while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) e--;
    *e = '\0';
    if (s == e || *s == '#') continue;
    if (*s == '@') {
      c->pattern = s;
      r = fail(c, SF_EINVAL, 1, "a list file cannot name another list file");
    } else {
      r = expand_pattern(c, s);
    }
  }
  if (!r && n < LIST_END) {
    c->pattern = path - 1;
    c->line++;
    if (n == LIST_NUL)
      r = fail(c, SF_EFORMAT, 0, "a NUL byte: a list file is text, one URL or pattern a line");
    else if (n == LIST_LONG_LINE)
      r = fail(c, SF_ETOOBIG, 0, "a line is longer than %d bytes: a list file holds one URL or pattern a line",
               MAX_LIST_LINE);
    else
      r = fail(c, SF_ETOOBIG, 0, "the list file is larger than %u MiB: use brace patterns or split the list",
               MAX_LIST_FILE >> 20);
  }
  funlockfile(f);
  if (!r && ferror(f)) {
    c->pattern = path - 1;
    r = fail(c, SF_EIO, 0, "read error in the list file: %s", strerror(errno));
  }
  c->file = NULL;
  free(line);
  fclose(f);
  return r;
}

int sf_shard_list_expand(sf_shard_list *list, const char *spec, sf_error *error) {
  list->urls = NULL;
  list->count = 0;
  ctx c = {.pattern = spec ? spec : "", .error = error, .list = list};
  if (!spec) return fail(&c, SF_EINVAL, 0, "no shard list given");
  char *copy = strdup(spec);
  if (!copy) return fail(&c, SF_ENOMEM, 0, "out of memory");
  int r = 0;
  /* Patterns are split at every "::" first (WebDataset's rule), then expanded in order. */
  for (char *s = copy; *spec && !r;) {
    char *sep = strstr(s, "::");
    if (sep) *sep = '\0';
    if (!*s) {
      c.pattern = spec;
      r = fail(&c, SF_EINVAL, (size_t)(s - copy) + 1,
               "empty pattern (a '::' at either end or two in a row)");
    } else if (*s == '@') {
      r = expand_file(&c, s + 1);
    } else {
      r = expand_pattern(&c, s);
    }
    if (!sep) break;
    s = sep + 2;
  }
  sf_strbuf_clear(&c.url);
  free(copy);
  if (r) sf_shard_list_clear(list);
  return r;
}

void sf_shard_list_clear(sf_shard_list *list) {
  if (!list) return;
  for (size_t i = 0; i < list->count; i++) free(list->urls[i]);
  free(list->urls);
  list->urls = NULL;
  list->count = 0;
}
