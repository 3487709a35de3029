/* Test harness: one node, in-memory unbounded ports, stepped by the caller. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "harness.h"
#include "node.h"
#include "options.h"

struct sf_harness {
  sf_context ctx;
  sf_node node;
  sf_queue in, out;
  sf_queue *in_ptr, *out_ptr;
  bool input_closed;
};

int sf_harness_new(sf_harness **ph, const char *stage, const char *const *options, uint64_t seed, uint64_t epochs,
                   int rank, int world_size, sf_error *error) {
  *ph = NULL;
  const sf_stage_def *def = sf_stage_find(stage);
  if (!def) return sf_graph_error(error, SF_EGRAPH, NULL, -1, "unknown stage type '%s'", stage);
  return sf_harness_new_def(ph, def, options, seed, epochs, rank, world_size, error);
}

int sf_harness_new_def(sf_harness **ph, const sf_stage_def *def, const char *const *options, uint64_t seed,
                       uint64_t epochs, int rank, int world_size, sf_error *error) {
  *ph = NULL;
  const char *stage = def->name;
  sf_graph *g = sf_graph_new_empty("<harness>");
  sf_graph_node *gn = g ? sf_graph_add_node(g, stage, stage, -1) : NULL;
  if (!gn) {
    sf_graph_destroy(&g);
    return SF_ENOMEM;
  }
  for (const char *const *o = options; o && *o; o++) {
    const char *eq = strchr(*o, '=');
    char key[128];
    if (!eq || (size_t)(eq - *o) >= sizeof key) {
      sf_graph_destroy(&g);
      return sf_graph_error(error, SF_EOPTION, NULL, -1, "harness option '%s' is not name=value", *o);
    }
    memcpy(key, *o, (size_t)(eq - *o));
    key[eq - *o] = '\0';
    if (sf_graph_node_set(gn, key, eq + 1, -1) < 0) {
      sf_graph_destroy(&g);
      return SF_ENOMEM;
    }
  }
  sf_harness *h = calloc(1, sizeof *h);
  if (!h) {
    sf_graph_destroy(&g);
    return SF_ENOMEM;
  }
  sf_context_init(&h->ctx);
  h->ctx.seed = seed;
  h->ctx.epochs = epochs;
  h->ctx.rank = rank;
  h->ctx.world_size = world_size;
  h->ctx.quiet = true;
  sf_queue_init(&h->in, 1u << 30, 1, 1);
  sf_queue_init(&h->out, 1u << 30, 1, 1);
  h->in_ptr = &h->in;
  h->out_ptr = &h->out;
  sf_node *n = &h->node;
  n->def = def;
  n->ctx = &h->ctx;
  n->replicas = 1;
  snprintf(n->name, sizeof n->name, "%s", stage);
  if (sf_port_count(def->inputs) > 0) {
    n->in.n = 1;
    n->in.queues = &h->in_ptr;
  }
  n->out.n = 1;
  n->out.queues = &h->out_ptr;
  *ph = h;
  int r = sf_graph_node_apply(g, gn, def, &n->priv, error);
  sf_graph_destroy(&g);
  if (r == 0 && def->init) r = def->init(n);
  if (r < 0) {
    if (error && h->ctx.has_error) *error = h->ctx.last_error;
    else if (error && !error->message[0]) sf_graph_error(error, r, NULL, -1, "init of %s failed: %s", stage, sf_strerror(r));
    sf_harness_destroy(ph);
    return r;
  }
  return 0;
}

void sf_harness_push(sf_harness *h, sf_item *item) { sf_queue_push(&h->in, item); }

void sf_harness_close_input(sf_harness *h) {
  if (!h->input_closed) sf_queue_close(&h->in);
  h->input_closed = true;
}

int sf_harness_run(sf_harness *h, uint64_t max_steps) {
  for (uint64_t i = 0; max_steps == 0 || i < max_steps; i++) {
    int r = sf_node_step(&h->node);
    if (r != 0) return r;
  }
  return 0;
}

int sf_harness_pop(sf_harness *h, sf_item *item) {
  int r = sf_queue_pop(&h->out, item);
  return r == SF_EOF ? SF_EAGAIN : r;
}

uint64_t sf_harness_error_count(const sf_harness *h) { return h->ctx.error_count; }
uint64_t sf_harness_skipped(const sf_harness *h) { return h->ctx.skipped; }
const sf_error *sf_harness_last_error(const sf_harness *h) { return h->ctx.has_error ? &h->ctx.last_error : NULL; }
void sf_harness_set_error_policy(sf_harness *h, int fail) { h->ctx.error_policy = fail ? SF_POLICY_FAIL : SF_POLICY_SKIP; }

void sf_harness_destroy(sf_harness **ph) {
  if (!ph || !*ph) return;
  sf_harness *h = *ph;
  sf_node *n = &h->node;
  if (n->priv) {
    if (n->def->uninit) n->def->uninit(n);
    sf_options_free(n->def->options, n->priv);
    free(n->priv);
  }
  sf_node_release_deferred(n);
  sf_queue_destroy(&h->in);
  sf_queue_destroy(&h->out);
  sf_context_destroy(&h->ctx);
  free(h);
  *ph = NULL;
}
