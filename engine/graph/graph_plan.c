/* The plan: replicas where the graph file leaves them unset, the edges that may carry deferred fields, what groups send. */
#include "graph_plan.h"

#include <stdlib.h>
#include <string.h>

#include "cpu_budget.h"
#include "graph_groups.h"
#include "options.h"
#include "registry.h"
#include "shardflow/index.h"

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

static void unset(sf_graph_node *n, const char *key);

/* Whether a count as written is 0 (zeros and spaces only: "0", "00", "" ). */
static bool is_zero(const char *text) { return strspn(text, "0 ") == strlen(text); }

/* The text node writes for key, or dflt. */
static const char *value_or(const sf_graph_node *n, const char *key, const char *dflt) {
  const sf_graph_value *v = sf_graph_node_value(n, key);
  return v ? v->value : dflt;
}

/* What a mix by position copies from its inputs' shard_sources (their defaults): how they deal, where the first
   epoch starts. */
static const char *const dealt_keys[] = {"deal", "start", "workers", "worker", "rank", "world_size"};
static const char *const dealt_defaults[] = {"0", "0", "1", "0", "-1", "-1"};

/*
 * A mix with stop: never and samples_per_epoch, or stop: first, whose inputs each come from a shard_source of
 * order: global with deal (through one-input stages of the same process) mixes by position: its sources learn
 * its name, their index and its weights (to replay its draws), and it learns how they deal. With stop: first
 * both learn every input's dataset size (mix_sizes, read from the indexes here, the one place), which ends
 * each epoch (sf_index_mix_end). Anything else runs as written, and so does a graph whose indexes cannot be
 * read here (the sources then report why). Returns 0 or SF_ENOMEM.
 */
static int plan_mix(sf_graph *g, const sf_stage_def **defs, const int *inputs, int i) {
  sf_graph_node *m = &g->nodes[i];
  const char *stop = value_or(m, "stop", "first");
  bool first = strcmp(stop, "first") == 0;
  if (!first && strcmp(stop, "never") != 0) return 0; /* longest: an ended input's positions would be holes */
  const char *spe = value_or(m, "samples_per_epoch", "0");
  if (!first && is_zero(spe)) return 0;
  int src[SF_GRAPH_MAX_INPUTS], n = 0;
  for (; n < SF_GRAPH_MAX_INPUTS && inputs[i * SF_GRAPH_MAX_INPUTS + n] >= 0; n++) {
    int x = inputs[i * SF_GRAPH_MAX_INPUTS + n];
    while (strcmp(defs[x]->name, "shard_source") != 0) {
      if (merges(inputs, x) || inputs[x * SF_GRAPH_MAX_INPUTS] < 0) return 0;
      x = inputs[x * SF_GRAPH_MAX_INPUTS];
    }
    const sf_graph_node *s = &g->nodes[x];
    const char *deal = value_or(s, "deal", "0"), *samples = value_or(s, "samples", "");
    const char *own = value_or(s, "samples_per_epoch", "0");
    if (s->group || m->group || strcmp(value_or(s, "order", "sequential"), "global") != 0 ||
        is_zero(deal) || samples[0] || !is_zero(own))
      return 0;
    for (int k = 0; k < n; k++)
      if (src[k] == x) return 0; /* one source feeding two inputs would be read twice over */
    for (size_t k = 0; n > 0 && k < sizeof dealt_keys / sizeof *dealt_keys; k++)
      if (strcmp(value_or(s, dealt_keys[k], dealt_defaults[k]),
                 value_or(&g->nodes[src[0]], dealt_keys[k], dealt_defaults[k])) != 0)
        return 0;
    src[n] = x;
  }
  if (n == 0) return 0; /* mix's init says what is missing */
  char weights[64 * SF_GRAPH_MAX_INPUTS], sizes[32 * SF_GRAPH_MAX_INPUTS] = "", number[32];
  const char *written = value_or(m, "weights", NULL);
  size_t len = (size_t)snprintf(weights, sizeof weights, "[");
  for (int k = 0; !written && k < n; k++) len += (size_t)snprintf(weights + len, sizeof weights - len, k ? ", 1" : "1");
  snprintf(weights + len, sizeof weights - len, "]");
  if (first) {
    len = (size_t)snprintf(sizes, sizeof sizes, "[");
    for (int k = 0; k < n; k++) {
      uint64_t size;
      sf_error error;
      if (sf_graph_source_size(g, src[k], &size, &error) < 0) return 0;
      len += (size_t)snprintf(sizes + len, sizeof sizes - len, k ? ", %llu" : "%llu", (unsigned long long)size);
    }
    snprintf(sizes + len, sizeof sizes - len, "]");
  }
  for (int k = 0; k < n; k++) {
    sf_graph_node *s = &g->nodes[src[k]];
    snprintf(number, sizeof number, "%d", k);
    if (sf_graph_node_set(s, "mix", m->name, -1) || sf_graph_node_set(s, "mix_input", number, -1) ||
        sf_graph_node_set(s, "mix_weights", written ? written : weights, -1) ||
        sf_graph_node_set(s, "mix_samples", spe, -1) || (first && sf_graph_node_set(s, "mix_sizes", sizes, -1)))
      return SF_ENOMEM;
  }
  for (size_t k = 0; k < sizeof dealt_keys / sizeof *dealt_keys; k++) {
    if (sf_graph_node_set(m, dealt_keys[k], value_or(&g->nodes[src[0]], dealt_keys[k], dealt_defaults[k]), -1))
      return SF_ENOMEM;
  }
  return first && sf_graph_node_set(m, "sizes", sizes, -1) ? SF_ENOMEM : 0;
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
  for (int i = 0; i < g->n_nodes; i++)
    if (strcmp(defs[i]->name, "mix") == 0 && plan_mix(g, defs, inputs, i) < 0) {
      /* Out of memory part way: a mix that deals must find every source dealing, so none does. */
      for (int j = 0; j < g->n_nodes; j++)
        if (strcmp(defs[j]->name, "mix") == 0) unset(&g->nodes[j], "deal");
        else if (strcmp(defs[j]->name, "shard_source") == 0) unset(&g->nodes[j], "mix");
      break;
    }
  for (int i = 0; i < g->n_nodes; i++) {
    int c = consumer[i];
    g->nodes[i].may_defer = (defs[i]->flags & SF_STAGE_MAKES_DEFERRED) && c >= 0 &&
                            (defs[c]->flags & SF_STAGE_TAKES_DEFERRED) && same_process(&g->nodes[i], &g->nodes[c]);
  }
  free(consumer);
}

int64_t sf_graph_edge_bytes(const sf_graph *g, const sf_graph_node *n) {
  const int64_t cap = SF_PLAN_DEFERRED_EDGE_BYTES;
  return n->may_defer && (!g->queue_bytes || cap < g->queue_bytes) ? cap : g->queue_bytes;
}

/* ---- the form a group's results travel in ---------------------------------------------------------------- */

/* An enum option of def as applied to priv (sf_graph_node_apply): its value's index, or -1. */
static int enum_value(const sf_stage_def *def, const void *priv, const char *name) {
  const sf_option *o = sf_option_find(def->options, name);
  return o && o->type == SF_OPT_ENUM ? *(const int *)((const char *)priv + o->offset) : -1;
}

/* Removes key from n's values (nothing when n does not write it). */
static void unset(sf_graph_node *n, const char *key) {
  for (int i = 0; i < n->n_values; i++)
    if (strcmp(n->values[i].key, key) == 0) {
      free(n->values[i].key);
      free(n->values[i].value);
      memmove(&n->values[i], &n->values[i + 1], (size_t)(n->n_values - i - 1) * sizeof *n->values);
      n->n_values--;
      return;
    }
}

/* True when name is free in g and in every group's stages of g (a worker's graph keeps the names). */
static bool name_free(const sf_graph *g, const char *name) {
  if (sf_graph_find_node(g, name)) return false;
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].group_stages && sf_graph_find_node(g->nodes[i].group_stages, name)) return false;
  return true;
}

/* In a ", "-joined `inputs:` list, the name from replaced by to. Returns 0 or SF_ENOMEM. */
static int rename_input(sf_graph_node *n, const char *from, const char *to) {
  char list[1024], out[1024] = "";
  snprintf(list, sizeof list, "%s", n->inputs);
  size_t len = 0;
  for (char *save = NULL, *name = strtok_r(list, ", ", &save); name && len < sizeof out;
       name = strtok_r(NULL, ", ", &save))
    len += (size_t)snprintf(out + len, sizeof out - len, "%s%s", len ? ", " : "", strcmp(name, from) == 0 ? to : name);
  char *copy = len < sizeof out ? strdup(out) : NULL;
  if (!copy) return SF_ENOMEM;
  free(n->inputs);
  n->inputs = copy;
  return 0;
}

/*
 * Where one group's results go and what its last stage makes: g's node x sends them to node c (the group's head
 * node of a head's graph, or the group's last node of a whole graph); aug is the group's last stage (in
 * aug_graph: the group's head node's stages, or g) and grp its options (the group's head node, or the `groups:` entry).
 * Returns the plan (SF_WIRE_*).
 */
static int wire_choice(const sf_graph *g, int c, const sf_graph *aug_graph, const sf_graph_node *aug,
                       const sf_graph_node *grp) {
  if (c < 0) return SF_WIRE_AS_MADE;
  if (g->nodes[c].group_stages || g->nodes[c].group) return SF_WIRE_INTO_GROUP;
  const sf_stage_def *def = sf_stage_find(aug->type), *head = sf_registry_group_head();
  if (!def || strcmp(def->name, "augment") != 0 || !head) return SF_WIRE_AS_MADE;
  void *priv = NULL, *group_priv = NULL;
  sf_error ignored;
  /* Options that do not parse: no plan, the run reports them as written. */
  if (sf_graph_node_apply(aug_graph, aug, def, &priv, &ignored) < 0) return SF_WIRE_AS_MADE;
  const sf_option *dtype = sf_option_find(def->options, "dtype"), *form = sf_option_find(head->options, "wire_form");
  int out = enum_value(def, priv, "dtype"), plan = SF_WIRE_AS_MADE;
  if (out >= 0 && strcmp(dtype->enum_names[out], "uint8") != 0 && form &&
      sf_graph_node_apply(g, grp, head, &group_priv, &ignored) == 0) {
    bool pinned = strcmp(form->enum_names[enum_value(head, group_priv, "wire_form")], "as_written") == 0;
    plan = pinned ? SF_WIRE_PINNED : SF_WIRE_UINT8;
    sf_options_free(head->options, group_priv);
    free(group_priv);
  } else if (out >= 0 && strcmp(dtype->enum_names[out], "uint8") == 0) {
    plan = SF_WIRE_WRITTEN_UINT8;
  }
  sf_options_free(def->options, priv);
  free(priv);
  return plan;
}

/*
 * The rewrite: aug (the group's augment) makes uint8 HWC crops, and a new augment inserted into g right after
 * node x (the group's head node, or the group's last node) applies aug's normalisation, layout and dtype; the
 * node c read from x now reads the new node. Returns 0 or SF_ENOMEM.
 */
static int send_uint8(sf_graph *g, int x, int c, sf_graph_node *aug) {
  char name[256];
  snprintf(name, sizeof name, "%s_normalize", aug->name);
  for (int k = 2; !name_free(g, name) && k < 1000; k++) snprintf(name, sizeof name, "%s_normalize%d", aug->name, k);
  /* What the new node takes from aug, copied before g's nodes move (aug may be one of them). */
  static const char *const moved[] = {"fields", "mean", "std", "layout", "dtype"};
  sf_graph_value values[5];
  int n_values = 0;
  for (size_t i = 0; i < sizeof moved / sizeof *moved; i++) {
    const sf_graph_value *v = sf_graph_node_value(aug, moved[i]);
    if (v) values[n_values++] = (sf_graph_value){(char *)moved[i], strdup(v->value), v->line};
  }
  char *from = strdup(g->nodes[x].name);
  const sf_graph_value *dtype = sf_graph_node_value(aug, "dtype");
  int64_t line = aug->line, dtype_line = dtype ? dtype->line : aug->line;
  int r = from ? 0 : SF_ENOMEM;
  for (int i = 0; i < n_values; i++)
    if (!values[i].value) r = SF_ENOMEM;
  /* The group's augment: the same crop, resize and flip, pixels as they are. */
  if (r == 0) {
    unset(aug, "mean");
    unset(aug, "std");
    if ((r = sf_graph_node_set(aug, "dtype", "uint8", dtype_line)) == 0)
      r = sf_graph_node_set(aug, "layout", "hwc", dtype_line);
  }
  sf_graph_node *n = r == 0 ? sf_graph_add_node(g, name, "augment", line) : NULL;
  if (r == 0 && !n) r = SF_ENOMEM;
  if (r == 0) { /* right after x, so that a consumer that read x by file order now reads it */
    sf_graph_node added = *n;
    memmove(&g->nodes[x + 2], &g->nodes[x + 1], (size_t)(g->n_nodes - x - 2) * sizeof *g->nodes);
    g->nodes[x + 1] = added;
    n = &g->nodes[x + 1];
    n->wire_normalize = true;
    for (int i = 0; i < n_values && r == 0; i++) r = sf_graph_node_set(n, values[i].key, values[i].value, values[i].line);
    if (c > x) c++;
    if (r == 0 && g->nodes[c].inputs) r = rename_input(&g->nodes[c], from, name);
  }
  for (int i = 0; i < n_values; i++) free(values[i].value);
  free(from);
  return r;
}

int sf_graph_plan_groups(sf_graph *g, sf_error *error) {
  int units = g->n_groups;
  for (int i = 0; i < g->n_nodes; i++) units += g->nodes[i].group_stages != NULL;
  int r = 0;
  for (int u = 0; u < units && r == 0; u++) {
    int *order = NULL, *inputs = NULL, *consumer = NULL;
    const sf_stage_def **defs = NULL;
    if (sf_graph_resolve_links(g, &order, &defs, &inputs, &(sf_error){0}) < 0) {
      free(order), free(defs), free(inputs);
      return 0; /* a graph that does not link: run as written, the run says why */
    }
    /* The u-th group: a group's head node's stages (a head's graph), else the u-th `groups:` entry (a whole graph). */
    int x = -1;
    sf_graph_node *grp = NULL, *aug = NULL;
    sf_graph *aug_graph = g;
    for (int i = 0, seen = 0; i < g->n_nodes && !grp; i++)
      if (g->nodes[i].group_stages && seen++ == u && g->nodes[i].group_stages->n_nodes > 0) {
        x = i;
        grp = &g->nodes[i];
        aug_graph = grp->group_stages;
        aug = &aug_graph->nodes[aug_graph->n_nodes - 1]; /* the stages are one chain, in order */
      }
    if (!grp && u < g->n_groups) {
      grp = &g->groups[u];
      for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[order[k]].group && strcmp(g->nodes[order[k]].group, grp->name) == 0) x = order[k];
      aug = x >= 0 ? &g->nodes[x] : NULL;
    }
    consumer = malloc((size_t)g->n_nodes * sizeof *consumer);
    if (!consumer) r = SF_ENOMEM;
    if (r == 0 && grp && aug) {
      consumers(g, inputs, consumer);
      grp->wire_plan = wire_choice(g, consumer[x], aug_graph, aug, grp);
      if (grp->wire_plan == SF_WIRE_UINT8) r = send_uint8(g, x, consumer[x], aug);
    }
    free(order), free(defs), free(inputs), free(consumer);
  }
  return r < 0 ? sf_error_set(error, r, SF_NOWHERE, "out of memory") : 0;
}

/* ---- --explain ------------------------------------------------------------------------------------------- */

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

/* The line of a group's group's head node i (after sf_graph_plan_groups): what its results travel to the head as. */
static void explain_wire(FILE *out, const sf_graph *g, const int *inputs, int i, const char *indent) {
  const sf_graph_node *n = &g->nodes[i];
  const char *as_made = "as the group's last stage makes them";
  int c = -1;
  for (int j = 0; j < g->n_nodes * SF_GRAPH_MAX_INPUTS && c < 0; j++)
    if (inputs[j] == i) c = j / SF_GRAPH_MAX_INPUTS;
  if (c < 0) return;
  const sf_graph_node *to = &g->nodes[c];
  switch (n->wire_plan) {
  case SF_WIRE_UINT8: {
    const sf_graph_value *v = sf_graph_node_value(to, "dtype");
    const char *dtype = v ? v->value : "float32";
    fprintf(out, "%s  %s -> head: uint8 HWC crops over the wire (%dx fewer bytes than %s), normalised on the head by %s "
            "(group option `wire_form: as_written` sends %s)\n", indent, n->name, strcmp(dtype, "bfloat16") == 0 ? 2 : 4,
            dtype, to->name, dtype);
    break;
  }
  case SF_WIRE_PINNED:
    fprintf(out, "%s  %s -> head: %s, written so (`wire_form: as_written`): the augment's float output crosses the "
            "wire\n", indent, n->name, as_made);
    break;
  case SF_WIRE_WRITTEN_UINT8:
    fprintf(out, "%s  %s -> head: uint8, as the group's augment writes it\n", indent, n->name);
    break;
  case SF_WIRE_INTO_GROUP:
    fprintf(out, "%s  %s -> %s: %s: the next stages run in another group's workers\n", indent, n->name, to->name,
            as_made);
    break;
  default:
    fprintf(out, "%s  %s -> head: %s (the plan sends uint8 only for a last augment with float output)\n", indent,
            n->name, as_made);
  }
}

/* The line of a mix the plan made deal by position (plan_mix): its inputs' sources and how its epoch ends. */
static void explain_mix(FILE *out, const sf_graph *g, const sf_graph_node *m, const char *indent) {
  const char *deal = value_or(m, "deal", "0");
  if (is_zero(deal)) return;
  const char *sizes = value_or(m, "sizes", NULL), *spe = value_or(m, "samples_per_epoch", "0");
  fprintf(out, "%s  deals by position: stop: %s over", indent, sizes ? "first" : "never");
  int said = 0;
  for (int k = 0; k < SF_GRAPH_MAX_INPUTS; k++) /* in the order of its inputs */
    for (int j = 0; j < g->n_nodes; j++) {
      const sf_graph_node *s = &g->nodes[j];
      const char *mix = value_or(s, "mix", NULL), *input = value_or(s, "mix_input", "-1");
      if (mix && strcmp(mix, m->name) == 0 && atoi(input) == k) fprintf(out, "%s %s", said++ ? "," : "", s->name);
    }
  fprintf(out, " (order: global, deal %s): the input of each mixed position is a seeded choice of (seed, epoch, "
          "position), dealt to ranks and workers in rounds of %s; ", deal, deal);
  if (sizes)
    fprintf(out, "an epoch ends before the first position that would draw an input past its dataset size %s%s%s; ",
            sizes, is_zero(spe) ? "" : ", or at samples_per_epoch ", is_zero(spe) ? "" : spe);
  fprintf(out, "a count of consumed positions resumes at any world size and workers\n");
}

/* Whether a batch-like consumer lends its rows: not with buckets (stages/batch.c's init). */
static void explain_lent_rows(FILE *out, const sf_graph_node *consumer, const char *indent) {
  const sf_graph_value *bucket = sf_graph_node_value(consumer, "bucket_field");
  if (bucket && bucket->value[0])
    fprintf(out, "%s  -> %s: rows copied by %s: it has buckets (bucket_field), each with rows of its own\n", indent,
            consumer->name, consumer->name);
  else
    fprintf(out, "%s  -> %s: written into the rows %s lends: each image goes straight into its batch buffer, on "
            "this stage's threads while it is in their cache, not copied there by %s\n", indent, consumer->name,
            consumer->name, consumer->name);
}

static void explain_nodes(FILE *out, const sf_graph *g, const sf_stage_def **defs, const int *inputs, const int *order,
                          int cpus, const char *indent) {
  for (int k = 0; k < g->n_nodes; k++) {
    int i = order[k];
    const sf_graph_node *n = &g->nodes[i];
    if (n->group_stages) {
      fprintf(out, "%s%-18s group: its stages run in worker processes, each planning for its own CPUs; on a "
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
      explain_wire(out, g, inputs, i, indent);
      continue;
    }
    fprintf(out, "%s%-18s %-12s replicas %-3lld %s\n", indent, n->name, defs[i]->name, (long long)n->replicas,
            replicas_why(n, defs[i], merges(inputs, i), cpus));
    if (strcmp(defs[i]->name, "mix") == 0) explain_mix(out, g, n, indent);
    int c = -1;
    for (int j = 0; j < g->n_nodes * SF_GRAPH_MAX_INPUTS && c < 0; j++)
      if (inputs[j] == i) c = j / SF_GRAPH_MAX_INPUTS;
    if (c < 0) continue;
    const char *to = g->nodes[c].name;
    if (n->may_defer)
      fprintf(out, "%s  -> %s: may carry deferred fields (a JPEG left undecoded): %s decodes only what it keeps; "
              "the edge holds at most %lld MiB of them (as pixels), so the images in flight stay in the cache\n",
              indent, to, to, (long long)(sf_graph_edge_bytes(g, n) >> 20));
    else if (defs[i]->flags & SF_STAGE_MAKES_DEFERRED)
      fprintf(out, "%s  -> %s: decoded here: %s\n", indent, to,
              g->nodes[c].group_stages ? "the next stages run in a group's workers (the wire carries data)"
                                       : "the next stage does not take deferred fields");
    if ((defs[i]->flags & SF_STAGE_BORROWS_ROWS) && !g->nodes[c].group_stages && (defs[c]->flags & SF_STAGE_LENDS_ROWS))
      explain_lent_rows(out, &g->nodes[c], indent);
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
  if (r == 0 && g) r = sf_graph_plan_groups(g, error);
  if (r < 0) {
    sf_graph_destroy(&g);
    return r;
  }
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

int sf_graph_mix_positions(const sf_graph *graph, uint64_t epoch, int world_size, uint64_t *positions,
                           sf_error *error) {
  sf_error scratch;
  if (!error) error = &scratch;
  *positions = 0;
  if (world_size < 1) return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "world_size %d: give the run's ranks, >= 1",
                                          world_size);
  sf_graph *g = NULL;
  int r = graph->n_groups > 0 ? sf_graph_split_groups(graph, &g, error) : 0;
  if (r < 0) return r;
  if (!g && !(g = sf_graph_copy(graph))) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory");
  int *order = NULL, *inputs = NULL, mix = -1;
  const sf_stage_def **defs = NULL;
  if ((r = sf_graph_resolve_links(g, &order, &defs, &inputs, error)) == 0) {
    sf_graph_plan(g, defs, inputs, 1);
    for (int i = 0; mix < 0 && i < g->n_nodes; i++)
      if (strcmp(defs[i]->name, "mix") == 0 && value_or(&g->nodes[i], "sizes", NULL)) mix = i;
    if (mix < 0) r = sf_error_set(error, SF_ENOENT, SF_NOWHERE, "no mix of the graph deals by position with stop: "
                                  "first (its inputs each shard_source order: global with deal)");
  }
  if (r == 0) { /* the mix's own options, as its init reads them */
    void *priv = NULL;
    r = sf_graph_node_apply(g, &g->nodes[mix], defs[mix], &priv, error);
    if (r == 0) {
      const sf_option *o = defs[mix]->options;
      sf_float_list weights = {0}, sizes = {0};
      int64_t samples = 0;
      for (; o->name; o++)
        if (strcmp(o->name, "weights") == 0) weights = *(const sf_float_list *)((const char *)priv + o->offset);
        else if (strcmp(o->name, "sizes") == 0) sizes = *(const sf_float_list *)((const char *)priv + o->offset);
        else if (strcmp(o->name, "samples_per_epoch") == 0) samples = *(const int64_t *)((const char *)priv + o->offset);
      double w[SF_GRAPH_MAX_INPUTS];
      uint64_t n_of[SF_GRAPH_MAX_INPUTS];
      for (int k = 0; k < sizes.n; k++) w[k] = weights.n ? weights.v[k] : 1.0, n_of[k] = (uint64_t)sizes.v[k];
      uint64_t limit = samples > 0 ? (uint64_t)samples * (uint64_t)world_size : UINT64_MAX;
      *positions = sf_index_mix_end(sf_graph_node_seed(g->seed, g->nodes[mix].name), epoch, w, n_of, sizes.n, limit);
      sf_options_free(defs[mix]->options, priv);
      free(priv);
    }
  }
  free(order);
  free(defs);
  free(inputs);
  sf_graph_destroy(&g);
  return r;
}
