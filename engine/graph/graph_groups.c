/* Groups: checking them, cutting the head's graph at them, and rebuilding a worker's part. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_groups.h"
#include "options.h"
#include "strbuf.h"

/* A YAML double-quoted scalar: backslash and quote escaped, control bytes as \xNN. */
static void append_quoted(sf_strbuf *t, const char *s) {
  sf_strbuf_add(t, "\"");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') sf_strbuf_appendf(t, "\\%c", *p);
    else if (*p < 0x20) sf_strbuf_appendf(t, "\\x%02x", *p);
    else sf_strbuf_append(t, p, 1);
  }
  sf_strbuf_add(t, "\"");
}

/* The group options table lives with the _remote stage that parses it. */
static const sf_stage_def *remote_def(void) { return sf_stage_find("_remote"); }

int sf_graph_check_groups(const sf_graph *g, sf_error *e) {
  if (g->n_groups == 0) {
    for (int i = 0; i < g->n_nodes; i++)
      if (g->nodes[i].group)
        return sf_graph_error(e, SF_EGRAPH, g, g->nodes[i].group_line,
                              "node '%s' names group '%s' but the graph has no `groups:` section", g->nodes[i].name,
                              g->nodes[i].group);
    return 0;
  }
  char names[512] = "";
  size_t len = 0;
  for (int i = 0; i < g->n_groups && len < sizeof names; i++)
    len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? ", " : "", g->groups[i].name);
  const sf_stage_def *remote = remote_def();
  for (int i = 0; i < g->n_groups; i++) {
    void *priv;
    int r = sf_graph_node_apply(g, &g->groups[i], remote, &priv, e);
    if (r < 0) return r;
    sf_options_free(remote->options, priv);
    free(priv);
  }
  int *order;
  const sf_stage_def **defs;
  int r = sf_graph_resolve(g, &order, &defs, e);
  if (r < 0) return r;
  for (int gi = 0; gi < g->n_groups && r == 0; gi++) {
    const sf_graph_node *grp = &g->groups[gi];
    int first = -1, last = -1;
    for (int k = 0; k < g->n_nodes && r == 0; k++) {
      const sf_graph_node *n = &g->nodes[order[k]];
      if (!n->group || strcmp(n->group, grp->name) != 0) continue;
      const sf_stage_def *def = defs[order[k]];
      if (!(def->flags & SF_STAGE_MAP) || def->input != SF_PORT_SAMPLE || def->output != SF_PORT_SAMPLE)
        r = sf_graph_error(e, SF_EGRAPH, g, n->group_line,
                           "node '%s' (%s) cannot run in group '%s': only map stages (one sample in, at most one "
                           "out, e.g. decode and augment) run in groups; sources, shuffle and batch stay on the head",
                           n->name, def->name, grp->name);
      else if (last >= 0 && last != k - 1)
        r = sf_graph_error(e, SF_EGRAPH, g, n->group_line,
                           "group '%s' is not one run of adjacent stages: node '%s' is separated from the group's "
                           "other nodes; give the stages between them the same group or use two groups",
                           grp->name, n->name);
      if (first < 0) first = k;
      last = k;
    }
    if (r == 0 && first < 0)
      r = sf_graph_error(e, SF_EGRAPH, g, grp->line,
                         "group '%s' has no stages: put `group: %s` on the stages it should run", grp->name, grp->name);
  }
  for (int i = 0; i < g->n_nodes && r == 0; i++)
    if (g->nodes[i].group && !sf_graph_find_group(g, g->nodes[i].group))
      r = sf_graph_error(e, SF_EGRAPH, g, g->nodes[i].group_line,
                         "node '%s' names group '%s', which `groups:` does not define (groups: %s)", g->nodes[i].name,
                         g->nodes[i].group, names);
  free(order);
  free(defs);
  return r;
}

/* The `stages:` entries of chain positions [from, to) as YAML text. */
static char *stages_yaml(const sf_graph *g, const int *order, int from, int to) {
  sf_strbuf t = {0};
  sf_strbuf_add(&t, "stages:\n");
  for (int k = from; k < to; k++) {
    const sf_graph_node *n = &g->nodes[order[k]];
    sf_strbuf_add(&t, "  - type: ");
    append_quoted(&t, n->type);
    sf_strbuf_add(&t, "\n    name: ");
    append_quoted(&t, n->name);
    sf_strbuf_appendf(&t, "\n    replicas: %lld\n", (long long)n->replicas);
    for (int j = 0; j < n->n_values; j++) {
      sf_strbuf_appendf(&t, "    %s: ", n->values[j].key);
      append_quoted(&t, n->values[j].value);
      sf_strbuf_add(&t, "\n");
    }
  }
  return sf_strbuf_take(&t, NULL);
}

static void copy_settings(sf_graph *dst, const sf_graph *src) {
  dst->seed = src->seed;
  dst->epochs = src->epochs;
  dst->error_policy = src->error_policy;
  dst->queue_size = src->queue_size;
  dst->threads = src->threads;
}

int sf_graph_split_groups(const sf_graph *g, sf_graph **head, sf_error *e) {
  *head = NULL;
  int r = sf_graph_check_groups(g, e);
  if (r < 0) return r;
  int *order;
  const sf_stage_def **defs;
  r = sf_graph_resolve(g, &order, &defs, e);
  if (r < 0) return r;
  free(defs);
  sf_graph *h = sf_graph_new_empty(g->path);
  if (!h) {
    free(order);
    return sf_graph_error(e, SF_ENOMEM, g, -1, "out of memory");
  }
  copy_settings(h, g);
  for (int k = 0; k < g->n_nodes && r == 0;) {
    const sf_graph_node *n = &g->nodes[order[k]];
    if (!n->group) {
      sf_graph_node *c = sf_graph_add_node(h, n->name, n->type, n->line);
      if (!c) r = SF_ENOMEM;
      if (c) c->replicas = n->replicas, c->replicas_line = n->replicas_line;
      for (int j = 0; c && j < n->n_values && r == 0; j++)
        r = sf_graph_node_set(c, n->values[j].key, n->values[j].value, n->values[j].line);
      k++;
      continue;
    }
    int end = k;
    while (end < g->n_nodes && g->nodes[order[end]].group && strcmp(g->nodes[order[end]].group, n->group) == 0) end++;
    const sf_graph_node *grp = sf_graph_find_group(g, n->group);
    sf_graph_node *c = sf_graph_add_node(h, grp->name, "_remote", grp->line);
    char *yaml = stages_yaml(g, order, k, end);
    if (!c || !yaml) r = SF_ENOMEM;
    for (int j = 0; c && j < grp->n_values && r == 0; j++)
      r = sf_graph_node_set(c, grp->values[j].key, grp->values[j].value, grp->values[j].line);
    if (r == 0) r = sf_graph_node_set(c, "stages", yaml, grp->line);
    free(yaml);
    k = end;
  }
  free(order);
  if (r < 0) {
    sf_graph_destroy(&h);
    return sf_graph_error(e, r, g, -1, "out of memory");
  }
  *head = h;
  return 0;
}

int sf_group_worker_graph(sf_graph **graph, const char *stages, uint64_t seed, int error_policy, int64_t threads,
                          const char *origin, sf_error *e) {
  *graph = NULL;
  /* stages holds "stages:\n  - ...": keep its entries, add the worker's own source and sink around them. */
  const char *entries = strchr(stages, '\n');
  sf_strbuf t = {0};
  sf_strbuf_appendf(&t, "seed: %llu\nerror_policy: %s\nthreads: %lld\nstages:\n  - type: _worker_source\n%s  - type: _worker_sink\n",
         (unsigned long long)seed, error_policy == SF_POLICY_FAIL ? "fail" : "skip", (long long)threads,
         entries ? entries + 1 : "");
  char *text = sf_strbuf_take(&t, NULL);
  if (!text) return sf_error_set(e, SF_ENOMEM, SF_AT(.url = origin), "out of memory");
  int r = sf_graph_load_string(graph, text, origin, e);
  free(text);
  return r;
}
