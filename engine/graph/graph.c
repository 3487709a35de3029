/* Graph intermediate form: building, copying, overriding, resolving the chain and applying options. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "plugin_loader.h"
#include "options.h"
#include "registry.h"

int sf_graph_error(sf_error *e, int code, const sf_graph *g, int64_t line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sf_error_setv(e, code, SF_AT(.url = g && g->path ? g->path : NULL, .line = line), fmt, ap);
  va_end(ap);
  return code;
}

static const char *const policies[] = {"skip", "fail", NULL};

const sf_option sf_graph_settings[] = {
    {"seed", SF_OPT_SEED, offsetof(sf_graph, seed), "0", 0, 0,
     "every random choice derives from it: shard order, crops and flips, the shuffle buffer", NULL},
    {"epochs", SF_OPT_COUNT, offsetof(sf_graph, epochs), "1", 0, 1e12, "epochs a run makes (0 = until stopped)", NULL},
    {"error_policy", SF_OPT_ENUM, offsetof(sf_graph, error_policy), "skip", 0, 0,
     "skip counts and reports bad input and goes on; fail stops with the error record", policies},
    {"max_errors", SF_OPT_COUNT, offsetof(sf_graph, max_errors), "0", 0, 1e15,
     "error records after which the run stops (0 = no limit)", NULL},
    {"max_error_rate", SF_OPT_FLOAT, offsetof(sf_graph, max_error_rate), "0.5", 0, 1,
     "the run stops once more than this fraction of the samples read were skipped (1 = never)", NULL},
    {"queue_size", SF_OPT_COUNT, offsetof(sf_graph, queue_size), "64", 2, 1e6, "items a sample edge holds (its queues share them between replicated stages, at least 4 each)", NULL},
    {"queue_bytes", SF_OPT_SIZE, offsetof(sf_graph, queue_bytes), "64MiB", 0, 1e15,
     "tensor bytes a sample or batch edge holds (shared by its queues between replicated stages; a queue always "
     "takes one item; 0 = items only)", NULL},
    {"threads", SF_OPT_COUNT, offsetof(sf_graph, threads), "0", 0, 1024,
     "pool workers that run the stages (0 = the CPU budget: the process's CPUs)", NULL},
    /* A fixed array, not an owned string: sf_graph_set_setting stores it itself, never through this row. */
    {"metrics", SF_OPT_STRING, offsetof(sf_graph, metrics), NULL, 0, 0,
     "serve Prometheus metrics on http://HOST:PORT/metrics while the pipeline runs (a PORT alone: 127.0.0.1; "
     "port 0 picks a free one)", NULL},
    {NULL},
};

sf_graph *sf_graph_new_empty(const char *path) {
  sf_graph *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->path = strdup(path ? path : "<graph>");
  char why[256];
  for (const sf_option *o = sf_graph_settings; o->name; o++) /* the defaults, as help and the docs state them */
    if (o->type != SF_OPT_STRING && o->default_value) (void)sf_option_parse(o, o->default_value, g, why, sizeof why);
  if (!g->path) {
    free(g);
    return NULL;
  }
  return g;
}

/* Fills the slot past *count in *array (grown by one) with a node of name and type. */
static sf_graph_node *append_node(sf_graph_node **array, int *count, const char *name, const char *type,
                                  int64_t line) {
  sf_graph_node *nodes = realloc(*array, (size_t)(*count + 1) * sizeof *nodes);
  if (!nodes) return NULL;
  *array = nodes;
  sf_graph_node *n = &nodes[*count];
  memset(n, 0, sizeof *n);
  n->name = strdup(name);
  n->type = strdup(type);
  n->line = line;
  n->replicas = 1;
  n->replicas_line = -1;
  if (!n->name || !n->type) {
    free(n->name);
    free(n->type);
    return NULL;
  }
  (*count)++;
  return n;
}

sf_graph_node *sf_graph_add_node(sf_graph *g, const char *name, const char *type, int64_t line) {
  return append_node(&g->nodes, &g->n_nodes, name, type, line);
}

sf_graph_node *sf_graph_add_group(sf_graph *g, const char *name, int64_t line) {
  return append_node(&g->groups, &g->n_groups, name, "group", line);
}

sf_graph_node *sf_graph_find_group(const sf_graph *g, const char *name) {
  for (int i = 0; i < g->n_groups; i++)
    if (strcmp(g->groups[i].name, name) == 0) return &g->groups[i];
  return NULL;
}

int sf_graph_node_set_group(sf_graph_node *n, const char *group, int64_t line) {
  char *copy = strdup(group);
  if (!copy) return SF_ENOMEM;
  free(n->group);
  n->group = copy;
  n->group_line = line;
  return 0;
}

const sf_graph_value *sf_graph_node_value(const sf_graph_node *n, const char *key) {
  for (int i = 0; n && key && i < n->n_values; i++)
    if (strcmp(n->values[i].key, key) == 0) return &n->values[i];
  return NULL;
}

int sf_graph_node_set(sf_graph_node *n, const char *key, const char *value, int64_t line) {
  for (int i = 0; i < n->n_values; i++) {
    if (strcmp(n->values[i].key, key) == 0) {
      char *v = strdup(value);
      if (!v) return SF_ENOMEM;
      free(n->values[i].value);
      n->values[i].value = v;
      n->values[i].line = line;
      return 0;
    }
  }
  sf_graph_value *vals = realloc(n->values, (size_t)(n->n_values + 1) * sizeof *vals);
  if (!vals) return SF_ENOMEM;
  n->values = vals;
  sf_graph_value *v = &vals[n->n_values];
  v->key = strdup(key);
  v->value = strdup(value);
  v->line = line;
  if (!v->key || !v->value) {
    free(v->key);
    free(v->value);
    return SF_ENOMEM;
  }
  n->n_values++;
  return 0;
}

int sf_graph_add_edge(sf_graph *g, const char *from, const char *to, int64_t line) {
  sf_graph_edge *edges = realloc(g->edges, (size_t)(g->n_edges + 1) * sizeof *edges);
  if (!edges) return SF_ENOMEM;
  g->edges = edges;
  sf_graph_edge *e = &edges[g->n_edges];
  e->from = strdup(from);
  e->to = strdup(to);
  e->line = line;
  if (!e->from || !e->to) {
    free(e->from);
    free(e->to);
    return SF_ENOMEM;
  }
  g->n_edges++;
  return 0;
}

sf_graph_node *sf_graph_find_node(const sf_graph *g, const char *name) {
  for (int i = 0; i < g->n_nodes; i++)
    if (strcmp(g->nodes[i].name, name) == 0) return &g->nodes[i];
  return NULL;
}

static void free_node(sf_graph_node *n) {
  for (int j = 0; j < n->n_values; j++) {
    free(n->values[j].key);
    free(n->values[j].value);
  }
  free(n->values);
  free(n->name);
  free(n->type);
  free(n->group);
  free(n->inputs);
  sf_graph_destroy(&n->group_stages);
}

void sf_graph_destroy(sf_graph **pg) {
  if (!pg || !*pg) return;
  sf_graph *g = *pg;
  for (int i = 0; i < g->n_nodes; i++) free_node(&g->nodes[i]);
  for (int i = 0; i < g->n_groups; i++) free_node(&g->groups[i]);
  free(g->groups);
  for (int i = 0; i < g->n_plugins; i++) free(g->plugins[i].name), free(g->plugins[i].build_id);
  free(g->plugins);
  for (int i = 0; i < g->n_edges; i++) {
    free(g->edges[i].from);
    free(g->edges[i].to);
  }
  free(g->nodes);
  free(g->edges);
  free(g->path);
  free(g);
  *pg = NULL;
}

int sf_graph_add_plugin(sf_graph *g, const char *name, int64_t line) {
  sf_graph_plugin *p = realloc(g->plugins, (size_t)(g->n_plugins + 1) * sizeof *p);
  if (!p) return SF_ENOMEM;
  g->plugins = p;
  p[g->n_plugins].build_id = NULL;
  if (!(p[g->n_plugins].name = strdup(name))) return SF_ENOMEM;
  p[g->n_plugins++].line = line;
  return 0;
}

int sf_graph_load_plugins(const sf_graph *g, sf_error *e) {
  for (int i = 0; i < g->n_plugins; i++) {
    sf_error why = {0};
    int rc = sf_plugin_load(g->plugins[i].name, NULL, &why);
    if (rc < 0) return sf_graph_error(e, rc, g, g->plugins[i].line, "%s", why.message);
  }
  return 0;
}

sf_graph *sf_graph_copy(const sf_graph *src) {
  sf_graph *g = sf_graph_new_empty(src->path);
  if (!g) return NULL;
  g->seed = src->seed;
  g->epochs = src->epochs;
  g->error_policy = src->error_policy;
  g->queue_size = src->queue_size;
  g->queue_bytes = src->queue_bytes;
  g->threads = src->threads;
  g->max_errors = src->max_errors;
  g->max_error_rate = src->max_error_rate;
  memcpy(g->metrics, src->metrics, sizeof g->metrics);
  for (int i = 0; i < src->n_nodes; i++)
    if (!sf_graph_copy_node(g, &src->nodes[i])) goto fail;
  for (int i = 0; i < src->n_groups; i++) {
    const sf_graph_node *s = &src->groups[i];
    sf_graph_node *n = sf_graph_add_group(g, s->name, s->line);
    if (!n) goto fail;
    for (int j = 0; j < s->n_values; j++)
      if (sf_graph_node_set(n, s->values[j].key, s->values[j].value, s->values[j].line) < 0) goto fail;
  }
  for (int i = 0; i < src->n_plugins; i++)
    if (sf_graph_add_plugin(g, src->plugins[i].name, src->plugins[i].line) < 0 ||
        (src->plugins[i].build_id && !(g->plugins[i].build_id = strdup(src->plugins[i].build_id))))
      goto fail;
  for (int i = 0; i < src->n_edges; i++)
    if (sf_graph_add_edge(g, src->edges[i].from, src->edges[i].to, src->edges[i].line) < 0) goto fail;
  g->edges_line = src->edges_line;
  return g;
fail:
  sf_graph_destroy(&g);
  return NULL;
}

sf_graph_node *sf_graph_copy_node(sf_graph *g, const sf_graph_node *s) {
  sf_graph_node *n = sf_graph_add_node(g, s->name, s->type, s->line);
  if (!n) return NULL;
  n->replicas = s->replicas;
  n->replicas_line = s->replicas_line;
  n->replicas_planned = s->replicas_planned;
  n->may_defer = s->may_defer;
  n->wire_plan = s->wire_plan;
  n->wire_normalize = s->wire_normalize;
  if (s->group && sf_graph_node_set_group(n, s->group, s->group_line) < 0) return NULL;
  for (int j = 0; j < s->n_values; j++)
    if (sf_graph_node_set(n, s->values[j].key, s->values[j].value, s->values[j].line) < 0) return NULL;
  if (s->group_stages && !(n->group_stages = sf_graph_copy(s->group_stages))) return NULL;
  if (s->inputs && !(n->inputs = strdup(s->inputs))) return NULL;
  n->inputs_line = s->inputs_line;
  n->attachment = s->attachment;
  return n;
}

int sf_graph_attach(sf_graph *g, const char *node, void *object) {
  sf_graph_node *n = g && node ? sf_graph_find_node(g, node) : NULL;
  if (!n) return SF_ENOENT;
  n->attachment = object;
  return 0;
}

int sf_graph_node_count(const sf_graph *g) { return g ? g->n_nodes : 0; }

const char *sf_graph_node_name(const sf_graph *g, int i) {
  return g && i >= 0 && i < g->n_nodes ? g->nodes[i].name : NULL;
}

const char *sf_graph_node_option(const sf_graph *g, int i, const char *option) {
  if (!g || i < 0 || i >= g->n_nodes || !option) return NULL;
  const sf_graph_node *n = &g->nodes[i];
  const sf_graph_value *v = sf_graph_node_value(n, option);
  if (v) return v->value;
  const sf_stage_def *def = sf_stage_find(n->type);
  const sf_option *o = def ? sf_option_find(def->options, option) : NULL;
  return o ? (o->default_value ? o->default_value : "") : NULL;
}

bool sf_graph_node_has_option(const sf_graph *g, int i, const char *option) {
  const sf_stage_def *def = g && i >= 0 && i < g->n_nodes ? sf_stage_find(g->nodes[i].type) : NULL;
  return def && option && (sf_option_find(def->options, option) || strcmp(option, "replicas") == 0);
}

const char *sf_graph_node_type(const sf_graph *g, int i) {
  return g && i >= 0 && i < g->n_nodes ? g->nodes[i].type : NULL;
}

static void stage_names(char *buf, size_t size) {
  size_t n = 0;
  void *it = NULL;
  const sf_stage_def *d;
  buf[0] = '\0';
  while ((d = sf_stage_iterate(&it))) {
    int w = snprintf(buf + n, size - n, "%s%s", n ? ", " : "", d->name);
    if (w < 0 || (size_t)w >= size - n) break;
    n += (size_t)w;
  }
}

static void node_names(const sf_graph *g, char *buf, size_t size) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < g->n_nodes; i++) {
    int w = snprintf(buf + n, size - n, "%s%s", n ? ", " : "", g->nodes[i].name);
    if (w < 0 || (size_t)w >= size - n) break;
    n += (size_t)w;
  }
}

int sf_graph_set_setting(sf_graph *g, const char *key, const char *value, int64_t line, sf_error *e) {
  char settings_help[256];
  sf_options_names(sf_graph_settings, settings_help, sizeof settings_help);
  if (strcmp(key, "metrics") == 0) { /* [HOST]:PORT or PORT, checked when the server binds (sf_metrics_server_new) */
    bool port_only = value[0] && strspn(value, "0123456789") == strlen(value);
    if (strlen(value) >= sizeof g->metrics || (!strchr(value, ':') && !port_only))
      return sf_graph_error(e, SF_EOPTION, g, line, "metrics: '%s' is not HOST:PORT (e.g. 127.0.0.1:9108; port 0 picks a free one)", value);
    snprintf(g->metrics, sizeof g->metrics, "%s", value);
    return 0;
  }
  const sf_option *o = sf_option_find(sf_graph_settings, key);
  if (!o)
    return sf_graph_error(e, SF_EGRAPH, g, line, "unknown graph setting '%s': valid settings are %s, stages, groups, plugins",
                          key, settings_help);
  char why[256];
  int r = sf_option_parse(o, value, g, why, sizeof why);
  if (r < 0) return sf_graph_error(e, SF_EOPTION, g, line, "%s", why);
  return 0;
}

int sf_graph_set(sf_graph *g, const char *target, const char *value, sf_error *e) {
  if (!g || !target || !value) return sf_graph_error(e, SF_EINVAL, g, -1, "sf_graph_set: NULL argument");
  const char *dot = strchr(target, '.');
  if (!dot) {
    int r = sf_graph_set_setting(g, target, value, -1, e);
    if (r == SF_EGRAPH) {
      char names[512], settings_help[256];
      node_names(g, names, sizeof names);
      sf_options_names(sf_graph_settings, settings_help, sizeof settings_help);
      return sf_graph_error(e, SF_EOPTION, g, -1,
                            "cannot set '%s': use NODE.OPTION (nodes: %s) or a graph setting (%s)", target,
                            names, settings_help);
    }
    return r;
  }
  char node_name[64];
  size_t len = (size_t)(dot - target);
  if (len >= sizeof node_name) len = sizeof node_name - 1;
  memcpy(node_name, target, len);
  node_name[len] = '\0';
  const char *key = dot + 1;
  sf_graph_node *n = sf_graph_find_node(g, node_name);
  sf_graph_node *group = n ? NULL : sf_graph_find_group(g, node_name);
  if (group) {
    const sf_stage_def *head = sf_registry_group_head();
    if (!sf_option_find(head->options, key)) {
      char names[1024];
      sf_options_names(head->options, names, sizeof names);
      return sf_graph_error(e, SF_EOPTION, g, -1, "cannot set '%s': groups have no option '%s' (options: %s)",
                            target, key, names);
    }
    if (sf_graph_node_set(group, key, value, -1) < 0) return sf_graph_error(e, SF_ENOMEM, g, -1, "out of memory");
    return 0;
  }
  if (!n) {
    char names[512];
    node_names(g, names, sizeof names);
    return sf_graph_error(e, SF_EOPTION, g, -1, "cannot set '%s': no node named '%s' (nodes: %s)", target,
                          node_name, names);
  }
  if (strcmp(key, "replicas") == 0) {
    int64_t v;
    if (sf_parse_count(value, &v) < 0 || v < 1 || v > 256)
      return sf_graph_error(e, SF_EOPTION, g, -1, "cannot set '%s': replicas must be 1..256", target);
    n->replicas = v;
    n->replicas_line = 0; /* written, without a line: the plan keeps it */
    return 0;
  }
  const sf_stage_def *def = sf_stage_find(n->type);
  if (def && !sf_option_find(def->options, key)) {
    char names[1024];
    sf_options_names(def->options, names, sizeof names);
    return sf_graph_error(e, SF_EOPTION, g, -1, "cannot set '%s': stage %s has no option '%s' (options: %s, replicas)",
                          target, n->type, key, names);
  }
  const sf_option *o = def ? sf_option_find(def->options, key) : NULL;
  if (o) { /* parsed now, so that the caller can say where the value came from (--set, a keyword argument) */
    void *scratch = calloc(1, def->priv_size ? def->priv_size : 1);
    if (!scratch) return sf_graph_error(e, SF_ENOMEM, g, -1, "out of memory");
    char why[512];
    int r = sf_option_parse(o, value, scratch, why, sizeof why);
    sf_options_free(def->options, scratch);
    free(scratch);
    if (r < 0) return sf_graph_error(e, r == SF_ENOMEM ? r : SF_EOPTION, g, -1, "cannot set '%s': %s", target, why);
  }
  if (sf_graph_node_set(n, key, value, -1) < 0) return sf_graph_error(e, SF_ENOMEM, g, -1, "out of memory");
  return 0;
}

int sf_graph_node_apply(const sf_graph *g, const sf_graph_node *n, const sf_stage_def *def, void **priv,
                        sf_error *e) {
  char why[512];
  *priv = calloc(1, def->priv_size ? def->priv_size : 1);
  if (!*priv) return sf_graph_error(e, SF_ENOMEM, g, n->line, "out of memory");
  int r = sf_options_set_defaults(def->options, *priv, why, sizeof why);
  if (r < 0) {
    r = sf_graph_error(e, r, g, n->line, "stage %s: a default does not parse (%s)", def->name, why);
    goto fail;
  }
  for (int i = 0; i < n->n_values; i++) {
    const sf_graph_value *v = &n->values[i];
    const sf_option *o = sf_option_find(def->options, v->key);
    if (!o) {
      char names[1024];
      sf_options_names(def->options, names, sizeof names);
      r = sf_graph_error(e, SF_EOPTION, g, v->line, "node '%s' (stage %s) has no option '%s'; valid options: %s, replicas",
                         n->name, def->name, v->key, names);
      goto fail;
    }
    r = sf_option_parse(o, v->value, *priv, why, sizeof why);
    if (r < 0) {
      r = sf_graph_error(e, r == SF_ENOMEM ? r : SF_EOPTION, g, v->line, "node '%s': %s%s", n->name, why,
                         v->line < 0 ? " (a value set on the graph after its file was read)" : "");
      goto fail;
    }
  }
  return 0;
fail:
  sf_options_free(def->options, *priv);
  free(*priv);
  *priv = NULL;
  return r;
}

static const char *kind_name(sf_port_kind k) {
  switch (k) {
  case SF_PORT_SHARD: return "shards";
  case SF_PORT_SAMPLE: return "samples";
  case SF_PORT_BATCH: return "batches";
  default: return "nothing";
  }
}

static int find_index(const sf_graph *g, const char *name) {
  for (int i = 0; i < g->n_nodes; i++)
    if (strcmp(g->nodes[i].name, name) == 0) return i;
  return -1;
}

/*
 * `edges:` is retired (a chain is the file's order; a stage that reads another, or several, names them with
 * `inputs:`): a graph that has it is refused with the order its edges make, to list the stages in, or with
 * what is wrong with them. Returns SF_EGRAPH (or SF_ENOMEM) in *e.
 */
static int edges_retired(const sf_graph *g, int *order, sf_error *e) {
  int n = g->n_nodes;
  if (n <= 0) /* not reached: a graph without stages is refused first */
    return sf_graph_error(e, SF_EGRAPH, g, g->edges_line, "`edges:` is retired: list the stages in the order they run");
  int *next = malloc((size_t)n * sizeof *next), *has_in = calloc((size_t)n, sizeof *has_in);
  if (!next || !has_in) {
    free(next);
    free(has_in);
    return sf_graph_error(e, SF_ENOMEM, g, -1, "out of memory");
  }
  for (int i = 0; i < n; i++) next[i] = -1;
  int r = 0;
  char names[512];
  node_names(g, names, sizeof names);
  for (int i = 0; i < g->n_edges && r == 0; i++) {
    const sf_graph_edge *ed = &g->edges[i];
    int a = find_index(g, ed->from), b = find_index(g, ed->to);
    if (a < 0 || b < 0)
      r = sf_graph_error(e, SF_EGRAPH, g, ed->line, "edge %s -> %s names an unknown node '%s' (nodes: %s)", ed->from,
                         ed->to, a < 0 ? ed->from : ed->to, names);
    else if (next[a] >= 0 || has_in[b])
      r = sf_graph_error(e, SF_EGRAPH, g, ed->line,
                         "edge %s -> %s: a node may have one input and one output edge (graphs are chains for now)",
                         ed->from, ed->to);
    else {
      next[a] = b;
      has_in[b] = 1;
    }
  }
  int start = -1;
  for (int i = 0; i < n && r == 0; i++) {
    if (has_in[i]) continue;
    if (start >= 0)
      r = sf_graph_error(e, SF_EGRAPH, g, g->nodes[i].line,
                         "nodes '%s' and '%s' both have no input edge: connect every node into one chain",
                         g->nodes[start].name, g->nodes[i].name);
    start = i;
  }
  int count = 0;
  for (int i = start; r == 0 && i >= 0 && count < n; i = next[i]) order[count++] = i;
  if (r == 0 && count != n)
    r = sf_graph_error(e, SF_EGRAPH, g, -1, "the edges do not join all %d nodes into one chain (a cycle?)", n);
  if (r == 0) {
    char chain[1024] = "";
    for (int k = 0, used = 0; k < n && used < (int)sizeof chain; k++)
      used += snprintf(chain + used, sizeof chain - (size_t)used, "%s%s", k ? ", " : "", g->nodes[order[k]].name);
    r = sf_graph_error(e, SF_EGRAPH, g, g->edges_line,
                       "`edges:` is retired: list the stages in the order they run (here: %s), each reads the one "
                       "before it, and remove `edges:`; a stage that reads another stage, or several (a mix), names "
                       "them with `inputs: [NAME, ...]`",
                       chain);
  }
  free(next);
  free(has_in);
  return r;
}

bool sf_graph_has_branches(const sf_graph *g) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].inputs) return true;
  return false;
}

/* The links of a graph with `inputs:`: file order is the order; a node without `inputs:` takes the one before it. */
static int branch_links(const sf_graph *g, const sf_stage_def **defs, int *order, int *inputs, sf_error *e) {
  char names[512];
  node_names(g, names, sizeof names);
  for (int i = 0; i < g->n_nodes; i++) {
    const sf_graph_node *n = &g->nodes[i];
    int ports = sf_port_capacity(defs[i]->inputs), count = 0, *in = &inputs[i * SF_GRAPH_MAX_INPUTS];
    order[i] = i;
    if (!n->inputs) {
      if (ports > 0 && i > 0) in[0] = i - 1;
      continue;
    }
    if (ports == 0)
      return sf_graph_error(e, SF_EGRAPH, g, n->inputs_line, "node '%s' (%s) is a source and takes no input: remove `inputs:`",
                            n->name, n->type);
    char list[1024];
    snprintf(list, sizeof list, "%s", n->inputs);
    for (char *save = NULL, *name = strtok_r(list, ", ", &save); name; name = strtok_r(NULL, ", ", &save)) {
      int from = find_index(g, name);
      if (from < 0)
        return sf_graph_error(e, SF_EGRAPH, g, n->inputs_line,
                              "node '%s': input '%s' is not a stage of this graph (stages: %s); inputs name stages by "
                              "their `name:`",
                              n->name, name, names);
      if (from >= i)
        return sf_graph_error(e, SF_EGRAPH, g, n->inputs_line,
                              "node '%s': input '%s' comes later in the file; list each stage after the stages it reads",
                              n->name, name);
      if (count >= ports || count >= SF_GRAPH_MAX_INPUTS)
        return sf_graph_error(e, SF_EGRAPH, g, n->inputs_line, "node '%s' (%s) takes at most %d input%s", n->name,
                              n->type, ports < SF_GRAPH_MAX_INPUTS ? ports : SF_GRAPH_MAX_INPUTS, ports == 1 ? "" : "s");
      in[count++] = from;
    }
  }
  return 0;
}

/* Each node's stage definition into defs[], checked: unique names, known types of this ABI, replicas only for
 * map stages, one output port. 0 or SF_EGRAPH in *e. */
static int find_defs(const sf_graph *g, const sf_stage_def **defs, sf_error *e) {
  int r = 0;
  for (int i = 0; i < g->n_nodes && r == 0; i++) {
    const sf_graph_node *n = &g->nodes[i];
    for (int j = 0; j < i; j++)
      if (strcmp(g->nodes[j].name, n->name) == 0)
        r = sf_graph_error(e, SF_EGRAPH, g, n->line, "two nodes are named '%s' (line %lld too): give each a unique `name`",
                           n->name, (long long)g->nodes[j].line);
    if (r) break;
    const sf_stage_def *def = sf_stage_find(n->type);
    if (!def) {
      char names[512];
      stage_names(names, sizeof names);
      r = sf_graph_error(e, SF_EGRAPH, g, n->line, "unknown stage type '%s'; valid types: %s", n->type, names);
      break;
    }
    if (def->abi_version != SF_STAGE_ABI_VERSION)
      r = sf_graph_error(e, SF_EGRAPH, g, n->line, "stage %s was built for stage ABI %u, this engine has %u", def->name,
                         def->abi_version, SF_STAGE_ABI_VERSION);
    else if (n->replicas > 1 && !(def->flags & SF_STAGE_MAP))
      r = sf_graph_error(e, SF_EGRAPH, g, n->replicas_line > 0 ? n->replicas_line : n->line,
                         "node '%s': stage %s keeps state between samples and cannot run as replicas; "
                         "only map stages (decode, augment, ...) can",
                         n->name, def->name);
    else if (sf_port_capacity(def->outputs) > 1)
      r = sf_graph_error(e, SF_EGRAPH, g, n->line,
                         "node '%s': stage %s has %d output ports, and fan-out is not supported yet: use stages with "
                         "one output port",
                         n->name, def->name, sf_port_capacity(def->outputs));
    defs[i] = def;
  }
  return r;
}

/* The chain's ends (a source first, batches last) and a consumer for every node but the last. 0 or SF_EGRAPH. */
static int check_ends(const sf_graph *g, const sf_stage_def **defs, const int *order, const int *consumer, sf_error *e) {
  int r = 0;
  const sf_graph_node *first = &g->nodes[order[0]];
  const sf_graph_node *last = &g->nodes[order[g->n_nodes - 1]];
  sf_port_kind last_out = sf_port_first_kind(defs[order[g->n_nodes - 1]]->outputs);
  if (sf_port_count(defs[order[0]]->inputs) > 0)
    r = sf_graph_error(e, SF_EGRAPH, g, first->line, "the first node '%s' (%s) needs input: start with shard_source",
                       first->name, first->type);
  else if (last_out != SF_PORT_BATCH && last_out != SF_PORT_NONE) /* a batch output, or a sink of its own */
    r = sf_graph_error(e, SF_EGRAPH, g, last->line,
                       "the last node '%s' (%s) outputs %s: end the graph with batch and device_sink", last->name,
                       last->type, kind_name(last_out));
  for (int k = 0; k + 1 < g->n_nodes && r == 0; k++)
    if (consumer[order[k]] < 0)
      r = sf_graph_error(e, SF_EGRAPH, g, g->nodes[order[k]].line,
                         "node '%s' feeds no stage: name it in a later stage's `inputs:` (a branch must end in a mix)",
                         g->nodes[order[k]].name);
  return r;
}

int sf_graph_resolve_links(const sf_graph *g, int **porder, const sf_stage_def ***pdefs, int **pinputs, sf_error *e) {
  *porder = NULL;
  *pdefs = NULL;
  *pinputs = NULL;
  if (g->n_nodes == 0) return sf_graph_error(e, SF_EGRAPH, g, -1, "the graph has no stages: add a `stages:` list");
  int *order = malloc((size_t)g->n_nodes * sizeof *order);
  const sf_stage_def **defs = calloc((size_t)g->n_nodes, sizeof *defs);
  int *inputs = malloc((size_t)g->n_nodes * SF_GRAPH_MAX_INPUTS * sizeof *inputs);
  int *consumer = malloc((size_t)g->n_nodes * sizeof *consumer);
  if (!order || !defs || !inputs || !consumer) {
    free(order);
    free(defs);
    free(inputs);
    free(consumer);
    return sf_graph_error(e, SF_ENOMEM, g, -1, "out of memory");
  }
  for (int i = 0; i < g->n_nodes * SF_GRAPH_MAX_INPUTS; i++) inputs[i] = -1;
  for (int i = 0; i < g->n_nodes; i++) consumer[i] = -1;
  int r = find_defs(g, defs, e);
  if (r == 0 && g->n_edges > 0) {
    r = edges_retired(g, order, e);
  } else if (r == 0 && sf_graph_has_branches(g)) {
    r = branch_links(g, defs, order, inputs, e);
  } else if (r == 0) { /* a chain: file order */
    for (int k = 0; k < g->n_nodes; k++) order[k] = k;
    for (int k = 0; k + 1 < g->n_nodes; k++) inputs[(k + 1) * SF_GRAPH_MAX_INPUTS] = k;
  }
  for (int k = 0; k < g->n_nodes && r == 0; k++) {
    int bi = order[k];
    const sf_graph_node *b = &g->nodes[bi];
    const sf_stage_def *db = defs[bi];
    const int *in = &inputs[bi * SF_GRAPH_MAX_INPUTS];
    if (in[1] >= 0 && b->replicas > 1)
      r = sf_graph_error(e, SF_EGRAPH, g, b->replicas_line > 0 ? b->replicas_line : b->line,
                         "node '%s' merges several inputs and cannot run as replicas yet: set replicas: 1", b->name);
    for (int p = 0; p < SF_GRAPH_MAX_INPUTS && in[p] >= 0 && r == 0; p++) {
      const sf_graph_node *a = &g->nodes[in[p]];
      const sf_stage_def *da = defs[in[p]];
      sf_port_kind out = sf_port_first_kind(da->outputs), want = sf_port_kind_at(db->inputs, p);
      if (consumer[in[p]] >= 0)
        r = sf_graph_error(e, SF_EGRAPH, g, b->inputs ? b->inputs_line : b->line,
                           "node '%s' feeds both '%s' and '%s': a stage's output goes to one stage (fan-out is not "
                           "supported)",
                           a->name, g->nodes[consumer[in[p]]].name, b->name);
      else if (out != want)
        r = sf_graph_error(e, SF_EGRAPH, g, b->line, "node '%s' (%s) outputs %s but node '%s' (%s) takes %s", a->name,
                           da->name, kind_name(out), b->name, db->name, kind_name(want));
      else if (a->replicas > 1 && b->replicas > 1 && a->replicas != b->replicas)
        r = sf_graph_error(e, SF_EGRAPH, g, b->line,
                           "nodes '%s' (replicas %lld) and '%s' (replicas %lld) are adjacent: use equal replicas or 1",
                           a->name, (long long)a->replicas, b->name, (long long)b->replicas);
      consumer[in[p]] = bi;
    }
  }
  if (r == 0) r = check_ends(g, defs, order, consumer, e);
  free(consumer);
  if (r < 0) {
    free(order);
    free(defs);
    free(inputs);
    return r;
  }
  *porder = order;
  *pdefs = defs;
  *pinputs = inputs;
  return 0;
}

int sf_graph_resolve(const sf_graph *g, int **porder, const sf_stage_def ***pdefs, sf_error *e) {
  int *inputs;
  int r = sf_graph_resolve_links(g, porder, pdefs, &inputs, e);
  if (r == 0) free(inputs);
  return r;
}

int sf_graph_node_input(const sf_graph *g, int i, int port) {
  if (!g || i < 0 || i >= g->n_nodes || port < 0 || port >= SF_GRAPH_MAX_INPUTS) return -1;
  int *order, *inputs;
  const sf_stage_def **defs;
  sf_error e;
  if (sf_graph_resolve_links(g, &order, &defs, &inputs, &e) < 0) return -1;
  int from = inputs[i * SF_GRAPH_MAX_INPUTS + port];
  free(order);
  free(defs);
  free(inputs);
  return from;
}

int sf_graph_check_nodes(const sf_graph *g, sf_error *e) {
  int *order;
  const sf_stage_def **defs;
  int r = sf_graph_resolve(g, &order, &defs, e);
  if (r < 0) return r;
  for (int i = 0; i < g->n_nodes && r == 0; i++) {
    void *priv;
    r = sf_graph_node_apply(g, &g->nodes[i], defs[i], &priv, e);
    if (r == 0) {
      sf_options_free(defs[i]->options, priv);
      free(priv);
    }
  }
  free(order);
  free(defs);
  return r;
}

uint64_t sf_graph_node_seed(uint64_t seed, const char *name) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the node name */
  for (const char *s = name; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  return sf_seed_mix(seed, h);
}
