/* Graph files: YAML (libyaml's document loader) into the graph's intermediate form, with line numbers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "graph.h"
#include "strbuf.h"

/* Bounds on what a graph file may ask for: aliases can make a small file name huge graphs, and
 * libyaml takes time quadratic in the nesting depth (34 s for 100,000 `[`). A graph needs 4 levels. */
enum { MAX_GRAPH_FILE = 1 << 20, MAX_STAGES = 1024, MAX_STAGE_KEYS = 128, MAX_DEPTH = 32 };

typedef struct reader {
  yaml_document_t *doc;
  sf_graph *graph;
  sf_error *error;
  const char *base_dir; /* the graph file's directory (relative plugin paths), or NULL for text */
} reader;

static int64_t line_of(const yaml_node_t *n) { return (int64_t)n->start_mark.line + 1; }

static const char *scalar(const yaml_node_t *n) {
  return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* A key written twice: YAML forbids it, and libyaml would let the last one win silently. */
static int check_keys(reader *r, const yaml_node_t *m) {
  for (const yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
    const yaml_node_t *kn = yaml_document_get_node(r->doc, p->key);
    const char *k = scalar(kn);
    if (!k) return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(kn), "keys must be plain words");
    for (const yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++) {
      const yaml_node_t *first = yaml_document_get_node(r->doc, q->key);
      if (strcmp(scalar(first), k) == 0)
        return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(kn),
                              "'%s' appears twice (lines %lld and %lld): keep one", k, (long long)line_of(first),
                              (long long)line_of(kn));
    }
  }
  return 0;
}

/* A scalar as is; a flow list of scalars as "a, b, c" for list-typed options. */
static int value_text(reader *r, const yaml_node_t *v, const char *key, char **out) {
  if (v->type == YAML_SCALAR_NODE) {
    *out = strdup(scalar(v));
    return *out ? 0 : SF_ENOMEM;
  }
  if (v->type == YAML_SEQUENCE_NODE) {
    sf_strbuf list = {0};
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
      const char *s = scalar(yaml_document_get_node(r->doc, *it));
      if (!s) {
        sf_strbuf_clear(&list);
        return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v),
                              "option '%s': a list may hold only plain values", key);
      }
      sf_strbuf_appendf(&list, "%s%s", list.len ? ", " : "", s);
    }
    *out = sf_strbuf_take(&list, NULL);
    return *out ? 0 : SF_ENOMEM;
  }
  return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v),
                        "option '%s' has a nested mapping; options take a value or a list", key);
}

static int read_stage(reader *r, const yaml_node_t *m) {
  if (m->type != YAML_MAPPING_NODE)
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(m),
                          "each entry of `stages` is a mapping with `type:` and options");
  if (m->data.mapping.pairs.top - m->data.mapping.pairs.start > MAX_STAGE_KEYS)
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(m), "a stage entry has more than %d keys",
                          MAX_STAGE_KEYS);
  int rc = check_keys(r, m);
  if (rc < 0) return rc;
  const char *type = NULL, *name = NULL;
  const yaml_node_t *replicas = NULL, *group = NULL, *inputs = NULL;
  for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
    const char *k = scalar(yaml_document_get_node(r->doc, p->key));
    const yaml_node_t *v = yaml_document_get_node(r->doc, p->value);
    if (strcmp(k, "type") == 0) type = scalar(v);
    else if (strcmp(k, "name") == 0) name = scalar(v);
    else if (strcmp(k, "replicas") == 0) replicas = v;
    else if (strcmp(k, "group") == 0) group = v;
    else if (strcmp(k, "inputs") == 0 || strcmp(k, "input") == 0) {
      if (inputs)
        return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v),
                              "a stage takes `inputs: [a, b]` or `input: a`, not both");
      inputs = v;
    }
  }
  if (!type || !type[0])
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(m),
                          "stage entry without `type:`; every stage names its type (see `shardflow help`)");
  sf_graph_node *n = sf_graph_add_node(r->graph, name && name[0] ? name : type, type, line_of(m));
  if (!n) return SF_ENOMEM;
  if (replicas) {
    const char *s = scalar(replicas);
    char *end = NULL;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || *end || v < 1 || v > 256)
      return sf_graph_error(r->error, SF_EOPTION, r->graph, line_of(replicas),
                            "node '%s': replicas must be a whole number 1..256", n->name);
    n->replicas = v;
    n->replicas_line = line_of(replicas);
  }
  if (group) {
    const char *s = scalar(group);
    if (!s || !s[0])
      return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(group),
                            "node '%s': group takes the name of an entry of `groups:`", n->name);
    if (sf_graph_node_set_group(n, s, line_of(group)) < 0) return SF_ENOMEM;
  }
  if (inputs) {
    rc = value_text(r, inputs, "inputs", &n->inputs);
    if (rc < 0) return rc;
    if (!n->inputs[0])
      return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(inputs),
                            "node '%s': `inputs` names the earlier stages that feed it, e.g. `inputs: [cifar, fmnist]`",
                            n->name);
    n->inputs_line = line_of(inputs);
  }
  for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
    const char *k = scalar(yaml_document_get_node(r->doc, p->key));
    if (strcmp(k, "type") == 0 || strcmp(k, "name") == 0 || strcmp(k, "replicas") == 0 || strcmp(k, "group") == 0 ||
        strcmp(k, "inputs") == 0 || strcmp(k, "input") == 0)
      continue;
    const yaml_node_t *v = yaml_document_get_node(r->doc, p->value);
    char *text = NULL;
    rc = value_text(r, v, k, &text);
    if (rc < 0) return rc;
    rc = sf_graph_node_set(n, k, text, line_of(v));
    free(text);
    if (rc < 0) return rc;
  }
  return 0;
}

static int read_edge(reader *r, const yaml_node_t *e) {
  const char *from = NULL, *to = NULL;
  char buf[256];
  if (e->type == YAML_SEQUENCE_NODE && e->data.sequence.items.top - e->data.sequence.items.start == 2) {
    from = scalar(yaml_document_get_node(r->doc, e->data.sequence.items.start[0]));
    to = scalar(yaml_document_get_node(r->doc, e->data.sequence.items.start[1]));
  } else if (e->type == YAML_SCALAR_NODE) {
    const char *s = scalar(e);
    const char *arrow = strstr(s, "->");
    if (arrow && strlen(s) < sizeof buf) {
      strcpy(buf, s);
      char *a = buf, *b = buf + (arrow - s) + 2;
      buf[arrow - s] = '\0';
      while (*a == ' ') a++;
      for (char *t = a + strlen(a); t > a && t[-1] == ' ';) *--t = '\0';
      while (*b == ' ') b++;
      for (char *t = b + strlen(b); t > b && t[-1] == ' ';) *--t = '\0';
      from = a;
      to = b;
    }
  }
  if (!from || !to || !from[0] || !to[0])
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(e),
                          "an edge is written `from -> to` or [from, to]");
  return sf_graph_add_edge(r->graph, from, to, line_of(e));
}

/* groups: {NAME: {option: value, ...}, ...}: where stages run outside the head process. */
static int read_groups(reader *r, const yaml_node_t *v) {
  if (v->type != YAML_MAPPING_NODE)
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v),
                          "`groups` maps group names to their options, e.g. `decoders: {processes: 2}`");
  if (v->data.mapping.pairs.top - v->data.mapping.pairs.start > MAX_STAGES)
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v), "more than %d groups", MAX_STAGES);
  for (yaml_node_pair_t *p = v->data.mapping.pairs.start; p < v->data.mapping.pairs.top; p++) {
    const yaml_node_t *kn = yaml_document_get_node(r->doc, p->key);
    const yaml_node_t *gv = yaml_document_get_node(r->doc, p->value);
    const char *name = scalar(kn);
    if (!name || !name[0] || strlen(name) > 31)
      return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(kn), "group names are plain words of 1-31 characters");
    if (sf_graph_find_group(r->graph, name))
      return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(kn), "group '%s' is defined twice", name);
    sf_graph_node *g = sf_graph_add_group(r->graph, name, line_of(kn));
    if (!g) return SF_ENOMEM;
    if (gv->type == YAML_SCALAR_NODE && !scalar(gv)[0]) continue; /* `decoders:` with no options */
    if (gv->type != YAML_MAPPING_NODE)
      return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(gv),
                            "group '%s' takes a mapping of options (processes, listen, ...)", name);
    if (gv->data.mapping.pairs.top - gv->data.mapping.pairs.start > MAX_STAGE_KEYS)
      return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(gv), "a group has more than %d keys",
                            MAX_STAGE_KEYS);
    int rc = check_keys(r, gv);
    if (rc < 0) return rc;
    for (yaml_node_pair_t *q = gv->data.mapping.pairs.start; q < gv->data.mapping.pairs.top; q++) {
      const char *k = scalar(yaml_document_get_node(r->doc, q->key));
      const yaml_node_t *val = yaml_document_get_node(r->doc, q->value);
      char *text = NULL;
      rc = value_text(r, val, k, &text);
      if (rc < 0) return rc;
      rc = sf_graph_node_set(g, k, text, line_of(val));
      free(text);
      if (rc < 0) return rc;
    }
  }
  return 0;
}

/* plugins: [audio, /opt/x/libmystage.so]: plugin names or .so paths, loaded before stage types are resolved. */
static int read_plugins(reader *r, const yaml_node_t *v) {
  if (v->type != YAML_SEQUENCE_NODE)
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v),
                          "`plugins` is a list of plugin names or .so paths, e.g. `plugins: [audio, /opt/x/libmystage.so]`");
  if (v->data.sequence.items.top - v->data.sequence.items.start > MAX_STAGES)
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v), "more than %d plugins", MAX_STAGES);
  for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
    const yaml_node_t *e = yaml_document_get_node(r->doc, *it);
    const char *name = scalar(e);
    if (!name || !name[0])
      return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(e),
                            "a `plugins` entry is a plugin name or a .so path");
    /* A relative path is the graph file's neighbour, as the graph's author sees it, wherever the run starts. */
    char *joined = NULL;
    if (r->base_dir && strchr(name, '/') && name[0] != '/' &&
        asprintf(&joined, "%s/%s", r->base_dir, name) < 0)
      return SF_ENOMEM;
    int rc = sf_graph_add_plugin(r->graph, joined ? joined : name, line_of(e));
    free(joined);
    if (rc < 0) return SF_ENOMEM;
  }
  return 0;
}

static int read_top(reader *r, const yaml_node_t *root) {
  if (!root || root->type != YAML_MAPPING_NODE)
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, root ? line_of(root) : 1,
                          "a graph file is a mapping with `stages:` (and optional seed, epochs, error_policy, groups)");
  if (root->data.mapping.pairs.top - root->data.mapping.pairs.start > MAX_STAGE_KEYS)
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(root), "a graph file has more than %d keys",
                          MAX_STAGE_KEYS);
  int rc = check_keys(r, root);
  if (rc < 0) return rc;
  bool have_stages = false;
  for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
    const char *k = scalar(yaml_document_get_node(r->doc, p->key));
    const yaml_node_t *v = yaml_document_get_node(r->doc, p->value);
    if (strcmp(k, "stages") == 0) {
      if (v->type != YAML_SEQUENCE_NODE)
        return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v), "`stages` is a list of stage entries");
      if (v->data.sequence.items.top == v->data.sequence.items.start)
        return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v),
                              "`stages` is empty: list the stages, from shard_source to device_sink");
      have_stages = true;
      if (v->data.sequence.items.top - v->data.sequence.items.start > MAX_STAGES)
        return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v), "more than %d stages", MAX_STAGES);
      for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top && !rc; it++)
        rc = read_stage(r, yaml_document_get_node(r->doc, *it));
    } else if (strcmp(k, "edges") == 0) { /* retired: read, so that the refusal can say what to write instead */
      r->graph->edges_line = line_of(yaml_document_get_node(r->doc, p->key));
      if (v->type != YAML_SEQUENCE_NODE)
        return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v), "`edges` is a list of `from -> to` entries");
      if (v->data.sequence.items.top - v->data.sequence.items.start > MAX_STAGES)
        return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v), "more than %d edges", MAX_STAGES);
      for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top && !rc; it++)
        rc = read_edge(r, yaml_document_get_node(r->doc, *it));
    } else if (strcmp(k, "groups") == 0) {
      rc = read_groups(r, v);
    } else if (strcmp(k, "plugins") == 0) {
      rc = read_plugins(r, v);
    } else if (!scalar(v)) {
      rc = sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(v), "setting '%s' takes a single value", k);
    } else {
      rc = sf_graph_set_setting(r->graph, k, scalar(v), line_of(v), r->error);
    }
    if (rc < 0) return rc;
  }
  if (!have_stages)
    return sf_graph_error(r->error, SF_EGRAPH, r->graph, line_of(root), "the graph has no `stages:` list");
  return 0;
}

static int syntax_error(const yaml_parser_t *parser, const sf_graph *g, sf_error *error) {
  if (parser->error == YAML_MEMORY_ERROR) return sf_graph_error(error, SF_ENOMEM, g, -1, "out of memory");
  return sf_graph_error(error, SF_EGRAPH, g, (int64_t)parser->problem_mark.line + 1, "YAML syntax: %s%s%s",
                        parser->problem ? parser->problem : "error", parser->context ? " " : "",
                        parser->context ? parser->context : "");
}

/*
 * One pass over libyaml's events before the document loader runs: refuses deep
 * nesting before the loader spends quadratic time on it, and a second document,
 * which the loader would leave unread.
 */
static int check_events(const char *text, const sf_graph *g, sf_error *error) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser)) return sf_graph_error(error, SF_ENOMEM, g, -1, "out of memory");
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
  int depth = 0, documents = 0, rc = 0;
  for (bool end = false; !end && rc == 0;) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&parser, &ev)) {
      rc = syntax_error(&parser, g, error);
      break;
    }
    int64_t line = (int64_t)ev.start_mark.line + 1;
    switch (ev.type) {
    case YAML_DOCUMENT_START_EVENT:
      if (++documents > 1)
        rc = sf_graph_error(error, SF_EGRAPH, g, line,
                            "a second YAML document starts here; a graph file holds one: remove the `---` "
                            "and merge what follows into the first");
      break;
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT:
      if (++depth > MAX_DEPTH)
        rc = sf_graph_error(error, SF_EGRAPH, g, line,
                            "lists and mappings nested deeper than %d levels (a graph file needs 4)", MAX_DEPTH);
      break;
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT: depth--; break;
    case YAML_STREAM_END_EVENT: end = true; break;
    default: break;
    }
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&parser);
  return rc;
}

/* Reads text (named name in messages); relative plugin paths resolve against base_dir when it is not NULL. */
static int load_text(sf_graph **pg, const char *text, const char *name, const char *base_dir, sf_error *error) {
  *pg = NULL;
  sf_graph *g = sf_graph_new_empty(name);
  if (!g) return SF_ENOMEM;
  int rc = check_events(text, g, error);
  if (rc < 0) {
    sf_graph_destroy(&g);
    return rc;
  }
  yaml_parser_t parser;
  yaml_document_t doc;
  if (!yaml_parser_initialize(&parser)) {
    sf_graph_destroy(&g);
    return SF_ENOMEM;
  }
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
  if (!yaml_parser_load(&parser, &doc)) {
    rc = syntax_error(&parser, g, error);
    yaml_parser_delete(&parser);
    sf_graph_destroy(&g);
    return rc;
  }
  reader r = {.doc = &doc, .graph = g, .error = error, .base_dir = base_dir};
  rc = read_top(&r, yaml_document_get_root_node(&doc));
  if (rc == SF_ENOMEM) sf_graph_error(error, rc, g, -1, "out of memory");
  yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  if (rc == 0) rc = sf_graph_load_plugins(g, error);
  if (rc == 0) rc = sf_graph_validate(g, error);
  if (rc < 0) {
    sf_graph_destroy(&g);
    return rc;
  }
  *pg = g;
  return 0;
}

int sf_graph_load_string(sf_graph **pg, const char *text, const char *name, sf_error *error) {
  return load_text(pg, text, name, NULL, error);
}

int sf_graph_load_file(sf_graph **pg, const char *path, sf_error *error) {
  *pg = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) {
    sf_graph tmp = {.path = (char *)path};
    return sf_graph_error(error, SF_ENOENT, &tmp, -1, "cannot open the graph file: %m");
  }
  char *text = malloc(MAX_GRAPH_FILE + 1);
  size_t n = text ? fread(text, 1, MAX_GRAPH_FILE + 1, f) : 0;
  bool failed = ferror(f);
  fclose(f);
  if (!text) return SF_ENOMEM;
  if (failed) {
    free(text);
    sf_graph tmp = {.path = (char *)path};
    return sf_graph_error(error, SF_EIO, &tmp, -1, "cannot read the graph file (a directory?)");
  }
  if (n > MAX_GRAPH_FILE) {
    free(text);
    sf_graph tmp = {.path = (char *)path};
    return sf_graph_error(error, SF_ETOOBIG, &tmp, -1, "graph files are limited to 1 MiB");
  }
  text[n] = '\0';
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : NULL;
  if (slash && !dir) {
    free(text);
    return SF_ENOMEM;
  }
  int rc = load_text(pg, text, path, dir, error); /* no '/': the graph is in the current directory already */
  free(dir);
  free(text);
  return rc;
}
