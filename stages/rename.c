/* rename: keeps, drops, renames and orders a sample's fields with `;`-alternatives (WebDataset's rename, to_tuple). */
#include <ctype.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>

#include "shardflow/stage.h"

/* Most alternatives one name may list ("jpg;jpeg;png;ppm" is 4). */
#define KEY_FIELD "__key__" /* names the sample's key as a source: "key=__key__" */
enum { MAX_ALTS = 8 };

/* One entry of `names`: the field's new name and the fields it may come from, in order of preference. */
typedef struct entry {
  char name[SF_FIELD_NAME_MAX];
  int n_alts;
  char alts[MAX_ALTS][SF_FIELD_NAME_MAX];
} entry;

typedef struct renamer {
  sf_name_list names; /* option */
  bool keep;          /* option */
  entry entries[SF_MAX_FIELDS];
  int n_entries;
} renamer;

static const sf_option options[] = {
    {"names", SF_OPT_NAME_LIST, offsetof(renamer, names), "", 0, 0,
     "comma-separated fields to output, in this order: NEW=ALT;ALT;... takes the first of the "
     "alternatives the sample has and calls it NEW (\"image=jpg;jpeg;png;ppm,label=cls\"); a bare "
     "NAME keeps a field as it is; a sample with none of an entry's alternatives is an error record; "
     "__key__ as a source is the sample's key, as uint8 bytes (\"key=__key__\"; list it in batch's ragged)",
     NULL},
    {"keep", SF_OPT_BOOL, offsetof(renamer, keep), "false", 0, 0,
     "also keep the fields `names` does not mention, after the named ones (WebDataset's rename "
     "keep=True); false outputs only the named fields (its to_tuple)",
     NULL},
    {NULL},
};

/* Copies the token [a, b) trimmed of spaces into out (lower-cased when lower); false when empty or too long. */
static bool token(const char *a, const char *b, char out[SF_FIELD_NAME_MAX], bool lower) {
  while (a < b && isspace((unsigned char)*a))
    a++;
  while (b > a && isspace((unsigned char)b[-1]))
    b--;
  if (a == b || b - a >= SF_FIELD_NAME_MAX) return false;
  for (size_t i = 0; i < (size_t)(b - a); i++)
    out[i] = lower ? (char)tolower((unsigned char)a[i]) : a[i];
  out[b - a] = '\0';
  return true;
}

/* Parses one NEW=ALT;ALT or NAME entry [a, b). */
static int parse_entry(sf_node *node, renamer *r, const char *a, const char *b) {
  entry *e = &r->entries[r->n_entries];
  const char *eq = memchr(a, '=', (size_t)(b - a));
  const char *alts = eq ? eq + 1 : a;
  for (const char *p = alts; p <= b;) {
    const char *end = memchr(p, ';', (size_t)(b - p));
    if (!end) end = b;
    if (e->n_alts == MAX_ALTS)
      return sf_node_option_error(node, "names", "\"%.*s\" lists more than %d alternatives", (int)(b - a), a,
                                  MAX_ALTS);
    if (!token(p, end, e->alts[e->n_alts++], true))
      return sf_node_option_error(node, "names",
                                  "\"%.*s\" has an empty or over-%d-byte field name; write "
                                  "NEW=ALT;ALT or NAME, separated by commas",
                                  (int)(b - a), a, SF_FIELD_NAME_MAX - 1);
    p = end + 1;
  }
  if (eq ? !token(a, eq, e->name, false) : !token(a, b, e->name, true) || e->n_alts > 1)
    return sf_node_option_error(node, "names",
                                "\"%.*s\" needs a new name before '=' (NEW=ALT;ALT) when it lists "
                                "alternatives, of at most %d bytes",
                                (int)(b - a), a, SF_FIELD_NAME_MAX - 1);
  for (int i = 0; i < r->n_entries; i++) {
    if (strcmp(r->entries[i].name, e->name) == 0)
      return sf_node_option_error(node, "names", "field '%s' is named twice", e->name);
    for (int j = 0; j < r->entries[i].n_alts; j++)
      for (int k = 0; k < e->n_alts; k++)
        if (strcmp(r->entries[i].alts[j], e->alts[k]) == 0)
          return sf_node_option_error(node, "names",
                                      "field '%s' is a source of both '%s' and '%s'; give each "
                                      "source field to one name",
                                      e->alts[k], r->entries[i].name, e->name);
  }
  r->n_entries++;
  return 0;
}

static int init(sf_node *node) {
  renamer *r = sf_node_priv(node);
  if (r->names.n == 0)
    return sf_node_option_error(node, "names",
                                "empty: list the fields to output, e.g. names: \"image=jpg;png,label=cls\"");
  for (int i = 0; i < r->names.n; i++) {
    if (r->n_entries == SF_MAX_FIELDS)
      return sf_node_option_error(node, "names", "lists more than %d fields", SF_MAX_FIELDS);
    const char *item = r->names.v[i];
    int rc = parse_entry(node, r, item, item + strlen(item));
    if (rc < 0) return rc;
  }
  return 0;
}

/* The extension decode chooses a decoder by: the name after its last dot, or the whole name. */
static const char *extension(const char *name) {
  const char *dot = strrchr(name, '.');
  return dot ? dot + 1 : name;
}

static bool is_source(const renamer *r, const char *name) {
  for (int i = 0; i < r->n_entries; i++) {
    if (strcmp(r->entries[i].name, name) == 0) return true;
    for (int j = 0; j < r->entries[i].n_alts; j++)
      if (strcmp(r->entries[i].alts[j], name) == 0) return true;
  }
  return false;
}

/* Lists the sample's field names for a message. */
static const char *field_list(const sf_sample *s, char *buf, size_t size) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < s->n_fields && n < size; i++)
    n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? ", " : "", s->fields[i].name);
  if (s->n_fields == 0) snprintf(buf, size, "none");
  return buf;
}

/* Appends the sample's key as a field named __key__ (uint8 bytes, marked decoded, like a checked txt
   member): WebDataset's to_tuple("__key__", ...). Returns its index, SF_ENOMEM, or SF_ETOOBIG when the sample is full. */
static int add_key_field(sf_sample *s) {
  size_t n = strlen(s->key ? s->key : "");
  sf_buffer *b = sf_buffer_new(n);
  if (!b) return SF_ENOMEM;
  if (n) memcpy(sf_buffer_data(b), s->key, n);
  sf_tensor t;
  const int64_t shape[1] = {(int64_t)n};
  int r = sf_tensor_view(&t, SF_DTYPE_UINT8, 1, shape, b, 0); /* takes b's reference */
  if (r < 0) return r;
  if (!sf_sample_add_field(s, KEY_FIELD, false, &t)) return SF_ETOOBIG;
  return s->n_fields - 1;
}

static int map(sf_node *node, sf_sample **ps) {
  const renamer *r = sf_node_priv(node);
  sf_sample *s = *ps;
  int order[SF_MAX_FIELDS], n = 0;
  bool used[SF_MAX_FIELDS] = {false};
  char have[SF_MAX_FIELDS * (SF_FIELD_NAME_MAX + 2)];
  for (int e = 0; e < r->n_entries; e++) {
    const entry *en = &r->entries[e];
    int found = -1;
    for (int a = 0; a < en->n_alts && found < 0; a++) {
      if (strcmp(en->alts[a], KEY_FIELD) == 0 && !sf_sample_field(s, KEY_FIELD)) {
        if ((found = add_key_field(s)) == SF_ENOMEM) return found; /* not the sample's fault: no record */
        if (found < 0) {
          sf_node_error(node, found, sf_sample_url(s), s->key, s->offset,
                        "cannot add the key as field '%s': the sample has %d fields (at most %d)", en->name,
                        s->n_fields, SF_MAX_FIELDS);
          return found;
        }
        break;
      }
      for (int i = 0; i < s->n_fields && found < 0; i++)
        if (strcmp(s->fields[i].name, en->alts[a]) == 0) found = i;
    }
    if (found < 0) {
      char wanted[MAX_ALTS * SF_FIELD_NAME_MAX];
      size_t w = 0;
      for (int a = 0; a < en->n_alts; a++)
        w += (size_t)snprintf(wanted + w, sizeof wanted - w, "%s%s", a ? ";" : "", en->alts[a]);
      sf_node_error(node, SF_ENOENT, sf_sample_url(s), s->key, s->offset,
                    "no field for '%s': wanted %s, the sample has %s", en->name, wanted,
                    field_list(s, have, sizeof have));
      return SF_ENOENT;
    }
    const sf_field *f = &s->fields[found];
    /* decode picks a decoder by the extension: an encoded field renamed to another would not be decoded. */
    if (f->encoded && strcmp(extension(f->name), extension(en->name)) != 0) {
      sf_node_error(node, SF_EINVAL, sf_sample_url(s), s->key, s->offset,
                    "field '%s' is still encoded: renamed to '%s' decode could not tell its format; put "
                    "decode before rename, or keep the extension (name it '%s.%s')",
                    f->name, en->name, en->name, extension(f->name));
      return SF_EINVAL;
    }
    order[n++] = found;
    used[found] = true;
  }
  if (r->keep)
    for (int i = 0; i < s->n_fields; i++)
      if (!used[i] && !is_source(r, s->fields[i].name)) order[n++] = i, used[i] = true;
  /* The named fields first, in order, renamed; the dropped ones after them, then removed. */
  sf_field fields[SF_MAX_FIELDS];
  int m = n;
  for (int i = 0; i < s->n_fields; i++)
    if (!used[i]) order[m++] = i;
  for (int i = 0; i < m; i++)
    fields[i] = s->fields[order[i]];
  memcpy(s->fields, fields, (size_t)m * sizeof fields[0]);
  for (int e = 0; e < r->n_entries; e++)
    memcpy(s->fields[e].name, r->entries[e].name, SF_FIELD_NAME_MAX);
  while (s->n_fields > n)
    sf_sample_remove_field(s, s->n_fields - 1);
  return 0;
}

const sf_stage_def sf_stage_rename = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "rename",
    .summary = "selects, renames and orders fields, with alternatives (image=jpg;png,label=cls)",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP,
    .priv_size = sizeof(renamer),
    .options = options,
    .init = init,
    .map = map,
};
