/* The plan: replicas where the graph file leaves them unset, and the edges that may carry deferred fields. */
#include "graph_plan.h"

#include <stdlib.h>
#include <string.h>

#include "cpu_budget.h"
#include "graph_groups.h"

/* consumer[i]: the node graph node i feeds, -1 for the last; from the links' inputs. */
static void consumers(const sf_graph *g, const int *inputs, int *consumer) {
  for (int i = 0; i < g->n_nodes; i++) consumer[i] = -1;
  for (int i = 0; i < g->n_nodes * SF_GRAPH_MAX_INPUTS; i++)
    if (inputs[i] >= 0) consumer[inputs[i]] = i / SF_GRAPH_MAX_INPUTS;
}

static bool merges(const int *inputs, int i) { return inputs[i * SF_GRAPH_MAX_INPUTS + 1] >= 0; }

/* Both on the head, or both in one group (a whole graph, as `shardflow dot` plans it, still has its groups). */
static bool same_process(const sf_graph_node *a, const sf_graph_node *b) {
  return a->group == b->group || (a->group && b->group && strcmp(a->group, b->group) == 0);
}

/*
 * Gives a planned node next to a written one the written count, until adjacent replicated nodes agree. Planned
 * nodes between two different written counts would trade them back and forth: after as many passes as there are
 * nodes, a planned node on an edge that still disagrees gets one replica, which agrees with anything.
 */
static void agree_with_written(sf_graph *g, const int *consumer) {
  for (int pass = 0;; pass++) {
    bool changed = false;
    for (int a = 0; a < g->n_nodes; a++) {
      int b = consumer[a];
      if (b < 0) continue;
      sf_graph_node *x = &g->nodes[a], *y = &g->nodes[b];
      if (x->replicas <= 1 || y->replicas <= 1 || x->replicas == y->replicas) continue;
      if (pass > g->n_nodes) {
        if (x->replicas_planned) x->replicas = 1, changed = true;
        if (y->replicas_planned) y->replicas = 1, changed = true;
      } else if (x->replicas_planned && !y->replicas_planned) {
        x->replicas = y->replicas, changed = true;
      } else if (y->replicas_planned && !x->replicas_planned) {
        y->replicas = x->replicas, changed = true;
      } else if (x->replicas_planned && y->replicas_planned) { /* two planned runs met: the larger count spreads */
        (x->replicas < y->replicas ? x : y)->replicas = x->replicas > y->replicas ? x->replicas : y->replicas;
        changed = true;
      }
    }
    if (!changed) return;
  }
}

void sf_graph_plan(sf_graph *g, const sf_stage_def **defs, const int *inputs, int cpus) {
  int *consumer = malloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *consumer);
  if (!consumer) return; /* no plan: the graph runs as written */
  consumers(g, inputs, consumer);
  for (int i = 0; i < g->n_nodes; i++) {
    sf_graph_node *n = &g->nodes[i];
    if ((defs[i]->flags & SF_STAGE_MAP) && n->replicas_line < 0 && !merges(inputs, i)) {
      n->replicas = cpus > 1 ? cpus : 1;
      n->replicas_planned = true;
    }
  }
  agree_with_written(g, consumer);
  for (int i = 0; i < g->n_nodes; i++) {
    int c = consumer[i];
    g->nodes[i].may_defer = (defs[i]->flags & SF_STAGE_MAKES_DEFERRED) && c >= 0 &&
                            (defs[c]->flags & SF_STAGE_TAKES_DEFERRED) && same_process(&g->nodes[i], &g->nodes[c]);
  }
  free(consumer);
}

/* Why node n runs as many replicas as it does. */
static const char *replicas_why(const sf_graph_node *n, const sf_stage_def *def, bool merging, int cpus) {
  if (n->replicas_line > 0) return "written in the graph file";
  if (n->replicas_line == 0) return "set by an override";
  if (n->replicas_planned && n->replicas == (cpus > 1 ? cpus : 1))
    return "planned: one per CPU of the budget (write `replicas:` to pin a count)";
  if (n->replicas_planned && n->replicas == 1)
    return "planned: one, between stages whose written replicas differ";
  if (n->replicas_planned) return "planned: as many as the next stage's written replicas (adjacent ones must agree)";
  if (merging) return "merges several inputs: one replica";
  if (!(def->flags & SF_STAGE_MAP)) return "keeps state between samples: one replica";
  return "";
}

static void explain_nodes(FILE *out, const sf_graph *g, const sf_stage_def **defs, const int *inputs, const int *order,
                          int cpus, const char *indent) {
  for (int k = 0; k < g->n_nodes; k++) {
    int i = order[k];
    const sf_graph_node *n = &g->nodes[i];
    if (n->group_stages) {
      fprintf(out, "%s%-16s group: its stages run in worker processes, each planning for its own CPUs; on a "
                   "worker of %d CPU(s):\n", indent, n->name, cpus);
      sf_graph *stages = NULL;
      int *sub_order = NULL, *sub_inputs = NULL;
      const sf_stage_def **sub_defs = NULL;
      sf_error e = {0};
      if (sf_group_worker_graph(&stages, n->group_stages, g->seed, g->error_policy, 0, &e) == 0 &&
          sf_graph_resolve_links(stages, &sub_order, &sub_defs, &sub_inputs, &e) == 0) {
        sf_graph_plan(stages, sub_defs, sub_inputs, cpus);
        explain_nodes(out, stages, sub_defs, sub_inputs, sub_order, cpus, "    ");
      }
      free(sub_order);
      free(sub_defs);
      free(sub_inputs);
      sf_graph_destroy(&stages);
      continue;
    }
    fprintf(out, "%s%-16s %-12s replicas %-3lld %s\n", indent, n->name, defs[i]->name, (long long)n->replicas,
            replicas_why(n, defs[i], merges(inputs, i), cpus));
    int c = -1;
    for (int j = 0; j < g->n_nodes * SF_GRAPH_MAX_INPUTS && c < 0; j++)
      if (inputs[j] == i) c = j / SF_GRAPH_MAX_INPUTS;
    if (c < 0) continue;
    const char *to = g->nodes[c].name;
    if (n->may_defer)
      fprintf(out, "%s  -> %s: may carry deferred fields (a JPEG left undecoded): %s decodes only what it keeps\n",
              indent, to, to);
    else if (defs[i]->flags & SF_STAGE_MAKES_DEFERRED)
      fprintf(out, "%s  -> %s: decoded here: %s\n", indent, to,
              g->nodes[c].group_stages ? "the next stages run in a group's workers (the wire carries data)"
                                       : "the next stage does not take deferred fields");
  }
}

void sf_graph_plan_explain(FILE *out, const sf_graph *g, const sf_stage_def **defs, const int *inputs,
                           const int *order, int cpus) {
  fprintf(out, "plan for %s: %d CPU(s) in this process's budget, %lld pool thread(s)%s\n", g->path ? g->path : "graph",
          cpus, (long long)(g->threads > 0 ? g->threads : cpus), g->threads > 0 ? " (written: threads)" : "");
  explain_nodes(out, g, defs, inputs, order, cpus, "  ");
}

int sf_graph_explain(const sf_graph *graph, FILE *out, sf_error *error) {
  sf_graph *g = NULL;
  int r = graph->n_groups > 0 ? sf_graph_split_groups(graph, &g, error) : 0;
  if (r < 0) return r;
  if (!g && !(g = sf_graph_copy(graph))) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory");
  int *order = NULL, *inputs = NULL;
  const sf_stage_def **defs = NULL;
  if ((r = sf_graph_resolve_links(g, &order, &defs, &inputs, error)) == 0) {
    int cpus = sf_cpu_budget_get().cpus;
    sf_graph_plan(g, defs, inputs, cpus);
    sf_graph_plan_explain(out, g, defs, inputs, order, cpus);
  }
  free(order);
  free(defs);
  free(inputs);
  sf_graph_destroy(&g);
  return r;
}
