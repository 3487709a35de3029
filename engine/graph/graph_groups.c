/* Groups: checking them (and so the whole graph: sf_graph_validate), cutting the head's graph at them, and rebuilding a
 * worker's part. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_groups.h"
#include "options.h"
#include "plugin_loader.h"
#include "registry.h"

/*
 * Checks `groups:` and `group:`: every group named by a node exists and has a valid configuration (the group
 * head's options table, engine/graph/registry.h), and each group is a contiguous run of sample-to-sample map
 * stages of the chain.  Returns 0 or SF_EGRAPH/SF_EOPTION with the graph file and line.
 */
static int check_groups(const sf_graph *g, sf_error *e) {
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
  const sf_stage_def *head = sf_registry_group_head();
  for (int i = 0; i < g->n_groups; i++) {
    void *priv;
    int r = sf_graph_node_apply(g, &g->groups[i], head, &priv, e);
    if (r < 0) return r;
    sf_options_free(head->options, priv);
    free(priv);
  }
  int *order, *inputs;
  const sf_stage_def **defs;
  int r = sf_graph_resolve_links(g, &order, &defs, &inputs, e);
  if (r < 0) return r;
  for (int gi = 0; gi < g->n_groups && r == 0; gi++) {
    const sf_graph_node *grp = &g->groups[gi];
    int first = -1, last = -1;
    for (int k = 0; k < g->n_nodes && r == 0; k++) {
      const sf_graph_node *n = &g->nodes[order[k]];
      if (!n->group || strcmp(n->group, grp->name) != 0) continue;
      const sf_stage_def *def = defs[order[k]];
      if (strcmp(def->name, "python") == 0) /* stages/python.c: its function lives in the head's interpreter */
        r = sf_graph_error(e, SF_EGRAPH, g, n->group_line,
                           "node '%s' (python) cannot run in group '%s': its Python function runs in the Python "
                           "program that started the pipeline, not in decode workers; remove the node's group:",
                           n->name, grp->name);
      else if (!(def->flags & SF_STAGE_MAP) || sf_port_first_kind(def->inputs) != SF_PORT_SAMPLE ||
          sf_port_first_kind(def->outputs) != SF_PORT_SAMPLE)
        r = sf_graph_error(e, SF_EGRAPH, g, n->group_line,
                           "node '%s' (%s) cannot run in group '%s': only map stages (one sample in, at most one "
                           "out, e.g. decode and augment) run in groups; sources, shuffle and batch stay on the head",
                           n->name, def->name, grp->name);
      else if (last >= 0 && last == k - 1 && inputs[order[k] * SF_GRAPH_MAX_INPUTS] != order[last])
        r = sf_graph_error(e, SF_EGRAPH, g, n->group_line,
                           "group '%s' is not one chain: node '%s' reads '%s', not the group's node above it; a group "
                           "is a run of stages each reading the one before",
                           grp->name, n->name, g->nodes[inputs[order[k] * SF_GRAPH_MAX_INPUTS]].name);
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
  free(inputs);
  return r;
}

/* The whole graph's check: the nodes' (engine/graph/graph.c), then the groups'. Here, above graph.c, so that
 * graph.c never calls this file. */
int sf_graph_validate(const sf_graph *g, sf_error *e) {
  int r = sf_graph_check_nodes(g, e);
  return r < 0 ? r : check_groups(g, e);
}

/* True when a stage of sub comes from plugin. */
static bool uses_plugin(const sf_graph *sub, const sf_plugin *plugin) {
  for (int i = 0; i < sub->n_nodes; i++) {
    const sf_stage_def *def = sf_stage_find(sub->nodes[i].type);
    if (def && sf_registry_stage_plugin(def) == plugin) return true;
  }
  return false;
}

/* The group's stages, chain positions [from, to), as a graph of their own: what its workers run. */
static sf_graph *group_stages(const sf_graph *g, const int *order, int from, int to) {
  sf_graph *sub = sf_graph_new_empty(g->path);
  for (int k = from; sub && k < to; k++) {
    sf_graph_node *n = sf_graph_copy_node(sub, &g->nodes[order[k]]);
    if (!n) {
      sf_graph_destroy(&sub);
      break;
    }
    free(n->group); /* inside the worker the stages run where they are */
    n->group = NULL;
    free(n->inputs); /* ... as a chain from the worker's own source */
    n->inputs = NULL;
  }
  /* The plugins the group's stages need, as the graph names them, with the build the head has. */
  for (int i = 0; sub && i < g->n_plugins; i++) {
    const sf_plugin *p;
    if (sf_plugin_load(g->plugins[i].name, &p, NULL) < 0 || !uses_plugin(sub, p)) continue; /* loaded: a no-op */
    if (sf_graph_add_plugin(sub, g->plugins[i].name, g->plugins[i].line) < 0 ||
        !(sub->plugins[sub->n_plugins - 1].build_id = strdup(p->build_id)))
      sf_graph_destroy(&sub);
  }
  return sub;
}

/* In node's `inputs:` (a node of the head's graph), names a group instead of the group's stages (g's). */
static int rename_inputs(const sf_graph *g, sf_graph_node *node) {
  char list[1024], out[1024] = "";
  snprintf(list, sizeof list, "%s", node->inputs);
  size_t len = 0;
  for (char *save = NULL, *name = strtok_r(list, ", ", &save); name && len < sizeof out;
       name = strtok_r(NULL, ", ", &save)) {
    const sf_graph_node *from = sf_graph_find_node(g, name);
    len += (size_t)snprintf(out + len, sizeof out - len, "%s%s", len ? ", " : "",
                            from && from->group ? from->group : name);
  }
  if (len >= sizeof out) return SF_ENOMEM;
  char *copy = strdup(out);
  if (!copy) return SF_ENOMEM;
  free(node->inputs);
  node->inputs = copy;
  return 0;
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
  int r = check_groups(g, e);
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
  memcpy(h->metrics, g->metrics, sizeof h->metrics); /* the head serves /metrics, not its workers */
  for (int k = 0; k < g->n_nodes && r == 0;) {
    const sf_graph_node *n = &g->nodes[order[k]];
    if (!n->group) {
      if (!sf_graph_copy_node(h, n)) r = SF_ENOMEM;
      k++;
      continue;
    }
    int end = k;
    while (end < g->n_nodes && g->nodes[order[end]].group && strcmp(g->nodes[order[end]].group, n->group) == 0) end++;
    const sf_graph_node *grp = sf_graph_find_group(g, n->group);
    sf_graph_node *c = sf_graph_add_node(h, grp->name, SF_GROUP_HEAD_STAGE, grp->line);
    if (!c || !(c->group_stages = group_stages(g, order, k, end))) r = SF_ENOMEM;
    /* On a branch: the group reads what its first stage read, and is read as its last stage was. */
    if (r == 0 && n->inputs && !(c->inputs = strdup(n->inputs))) r = SF_ENOMEM;
    if (r == 0) c->inputs_line = n->inputs_line;
    for (int j = 0; c && j < grp->n_values && r == 0; j++)
      r = sf_graph_node_set(c, grp->values[j].key, grp->values[j].value, grp->values[j].line);
    k = end;
  }
  for (int i = 0; r == 0 && i < h->n_nodes; i++)
    if (h->nodes[i].inputs) r = rename_inputs(g, &h->nodes[i]);
  free(order);
  if (r < 0) {
    sf_graph_destroy(&h);
    return sf_graph_error(e, r, g, -1, "out of memory");
  }
  *head = h;
  return 0;
}

int sf_group_worker_graph(sf_graph **graph, const sf_graph *stages, uint64_t seed, int error_policy, int64_t threads,
                          sf_error *e) {
  /* The head's nodes between the worker's own source and sink; messages name the head's file and lines. */
  sf_graph *g = sf_graph_new_empty(stages->path);
  int r = g ? 0 : SF_ENOMEM;
  if (r == 0) {
    g->seed = seed;
    g->error_policy = error_policy;
    g->threads = threads;
    if (!sf_graph_add_node(g, "_worker_source", "_worker_source", -1)) r = SF_ENOMEM;
  }
  for (int i = 0; r == 0 && i < stages->n_nodes; i++)
    if (!sf_graph_copy_node(g, &stages->nodes[i])) r = SF_ENOMEM;
  if (r == 0 && !sf_graph_add_node(g, "_worker_sink", "_worker_sink", -1)) r = SF_ENOMEM;
  if (r < 0) {
    sf_graph_destroy(&g);
    return sf_error_set(e, SF_ENOMEM, SF_NOWHERE, "out of memory");
  }
  r = sf_graph_validate(g, e);
  if (r < 0) {
    sf_graph_destroy(&g);
    return r;
  }
  *graph = g;
  return 0;
}
