/* python: hands each sample to a Python function on the embedding program's own thread (shardflow.Pipeline) and passes on what it returns. */
#include <stddef.h>
#include <stdio.h>

#include "shardflow/handoff.h"
#include "shardflow/stage.h"

typedef struct python {
  char *function;      /* option: "pkg.module:fn", resolved by the Python package */
  int64_t in_flight;   /* option */
  sf_handoff *h;
  bool input_done;
} python;

static const sf_option options[] = {
    {"function", SF_OPT_STRING, offsetof(python, function), NULL, 0, 0,
     "the Python function that maps a sample, as \"pkg.module:fn\" (imported by shardflow.Pipeline; "
     "Pipeline(map={NODE: fn}) may give it instead)",
     NULL},
    {"in_flight", SF_OPT_COUNT, offsetof(python, in_flight), "16", 1, 65536,
     "most samples between this node and the Python thread at once, in samples", NULL},
    {NULL},
};

static int init(sf_node *node) {
  python *p = sf_node_priv(node);
  /* shardflow.Pipeline attaches the handoff its map thread serves (sf_graph_attach) */
  if (!(p->h = sf_handoff_ref(sf_node_attachment(node)))) {
    int code = SF_EUNSUPPORTED;
    sf_node_error(node, code, NULL, NULL, -1,
                  "node '%s' (type: python) calls a Python function, which only a pipeline started from Python "
                  "provides: run this graph with shardflow.Pipeline (not `shardflow run`), and keep the node out "
                  "of any group (decode workers run no Python)",
                  sf_node_name(node));
    return code;
  }
  sf_handoff_set_wake(p->h, sf_node_notify, node);
  return 0;
}

/* Passes the oldest finished item on: the result, a counted drop, or the function's error record. */
static int emit(sf_node *node, python *p) {
  sf_item item;
  int status;
  char message[512];
  if (sf_handoff_get(p->h, &item, &status, message, sizeof message) < 0) return SF_EAGAIN;
  if (item.kind != SF_ITEM_SAMPLE || status == SF_HANDOFF_PASS) {
    uint64_t bytes = sf_item_nbytes(&item);
    bool sample = item.kind == SF_ITEM_SAMPLE;
    sf_node_push(node, &item);
    if (sample) sf_node_count_output(node, 1, bytes);
    return 0;
  }
  int r = 0;
  if (status < 0)
    r = sf_node_error(node, status, sf_sample_url(item.u.sample), item.u.sample->key, -1, "%s", message);
  if (status == SF_ECANCELED) r = status; /* a stop request (KeyboardInterrupt), not bad data: never skipped */
  sf_item_clear(&item);
  if (r < 0) return r;
  /* An error under the skip policy is skipped; fn's None is a filter's drop, outside the error budget. */
  if (status < 0)
    sf_node_count_skipped(node, 1);
  else
    sf_node_count_filtered(node, 1);
  return 0;
}

static int step(sf_node *node) {
  python *p = sf_node_priv(node);
  int r = emit(node, p);
  if (r != SF_EAGAIN) return r;
  if (!p->input_done && sf_handoff_can_put(p->h)) {
    sf_item item;
    r = sf_node_pop(node, &item);
    if (r == 0) {
      if (sf_handoff_put(p->h, &item) < 0) sf_item_clear(&item); /* closed: the pipeline is going away */
      return 0;
    }
    if (r != SF_EOF && r != SF_EAGAIN) return r;
    p->input_done = r == SF_EOF;
  }
  return p->input_done && sf_handoff_in_flight(p->h) == 0 ? SF_EOF : SF_EAGAIN;
}

static void uninit(sf_node *node) {
  python *p = sf_node_priv(node);
  if (p->h) sf_handoff_set_wake(p->h, NULL, NULL);
  sf_handoff_unref(&p->h);
}

const sf_stage_def sf_stage_python = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "python",
    .summary = "maps each sample with a Python function, on a thread of its own in the Python program that "
               "runs the graph (shardflow.Pipeline); refused by `shardflow run` and inside groups",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(python),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
};
