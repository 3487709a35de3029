/* mix: merges the samples of several branches (datasets) by weight, deterministic from the graph seed and the epoch. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/stage.h"

enum { STOP_FIRST, STOP_LONGEST, STOP_NEVER };
static const char *const stop_names[] = {"first", "longest", "never", NULL};

typedef struct mix {
  sf_float_list weights;     /* option */
  int stop;                  /* option: STOP_* */
  int64_t samples_per_epoch; /* option; 0 = until the inputs end */
  int n;                     /* connected inputs: as many ports as `inputs:` names (its port list is a template) */
  double *w;                 /* [n] weights, normalised (owned) */
  bool *ended;               /* [n] the input has no more samples for this epoch (owned) */
  bool *closed;              /* [n] the input ended for good (SF_EOF) (owned) */
  uint64_t epoch, end;       /* epoch being mixed; epoch to stop at (UINT64_MAX = never) */
  uint64_t emitted;          /* samples of this epoch handed on */
  int pending;               /* the input drawn for the next sample, or -1 */
  bool started;              /* rng and counters are set for epoch */
  sf_rng rng;
} mix;

static const sf_option options[] = {
    {"weights", SF_OPT_FLOAT_LIST, offsetof(mix, weights), NULL, 0, 0,
     "relative weight of each input, in the order of `inputs:` (normalised; empty = equal weights)", NULL},
    {"stop", SF_OPT_ENUM, offsetof(mix, stop), "first", 0, 0,
     "when an input runs out of samples for the epoch: first = end the epoch; longest = go on with the "
     "others until all are out; never = read the input's next pass (endless inputs: shard_source "
     "sampling: resample) until samples_per_epoch",
     stop_names},
    {"samples_per_epoch", SF_OPT_COUNT, offsetof(mix, samples_per_epoch), "0", 0, 0,
     "samples per epoch out of the mix on every rank (0 = until the stop policy ends the epoch; "
     "required by stop: never)",
     NULL},
    {NULL},
};

static int init(sf_node *node) {
  mix *m = sf_node_priv(node);
  m->n = sf_node_input_count(node);
  if (m->n < 1)
    return sf_node_option_error(node, NULL, "mix has no input: name the stages it mixes in its `inputs:`, e.g. "
                                "inputs: [cifar, fmnist]");
  m->w = calloc((size_t)m->n, sizeof *m->w);
  m->ended = calloc((size_t)m->n, sizeof *m->ended);
  m->closed = calloc((size_t)m->n, sizeof *m->closed);
  if (!m->w || !m->ended || !m->closed) {
    sf_node_error(node, SF_ENOMEM, NULL, NULL, -1, "out of memory for %d inputs", m->n);
    return SF_ENOMEM;
  }
  if (m->weights.n != 0 && m->weights.n != m->n)
    return sf_node_option_error(node, "weights", "%d values for %d inputs: give one weight per name of `inputs:`",
                                m->weights.n, m->n);
  double largest = 0, total = 0;
  for (int i = 0; i < m->n; i++) {
    m->w[i] = m->weights.n ? m->weights.v[i] : 1.0;
    if (!(m->w[i] >= 0 && isfinite(m->w[i])))
      return sf_node_option_error(node, "weights", "%g is not a finite number >= 0; give each input a weight >= 0",
                                  m->w[i]);
    if (m->w[i] > largest) largest = m->w[i];
  }
  if (!(largest > 0))
    return sf_node_option_error(node, "weights", "all are 0; give at least one input a weight above 0");
  /* Scaled by the largest first: weights near DBL_MAX would sum to infinity and normalise to 0. */
  for (int i = 0; i < m->n; i++) total += m->w[i] /= largest;
  for (int i = 0; i < m->n; i++) m->w[i] /= total;
  if (m->stop == STOP_NEVER && m->samples_per_epoch == 0)
    return sf_node_option_error(node, "stop", "never mixes without end: set samples_per_epoch to cut each epoch");
  m->epoch = sf_node_first_epoch(node);
  m->end = sf_node_epochs(node) ? sf_node_epochs(node) : UINT64_MAX;
  m->pending = -1;
  return 0;
}

/* The draws of an epoch depend only on the node's seed and the epoch: a resumed run repeats them. */
static void start_epoch(sf_node *node, mix *m) {
  sf_rng_seed(&m->rng, sf_seed_mix(sf_node_seed(node), m->epoch));
  for (int i = 0; i < m->n; i++) m->ended[i] = m->closed[i];
  m->emitted = 0;
  m->pending = -1;
  m->started = true;
}

/* Ends the epoch; sources that repeat until the epoch is closed (resample, samples_per_epoch) move on. */
static int end_epoch(sf_node *node, mix *m) {
  sf_item end = {.kind = SF_ITEM_EPOCH_END, .epoch = m->epoch};
  sf_node_push(node, &end);
  sf_node_close_epoch(node, m->epoch);
  m->epoch++;
  m->started = false;
  return 0;
}

/* Draws an input among those not ended, by weight; -1 when all have ended (a weight of 0 is never drawn). */
static int draw(mix *m) {
  double total = 0;
  int last = -1;
  for (int i = 0; i < m->n; i++)
    if (!m->ended[i] && m->w[i] > 0) total += m->w[i], last = i;
  if (last < 0) return -1;
  double u = sf_rng_double(&m->rng) * total;
  for (int i = 0; i < m->n; i++) {
    if (m->ended[i] || m->w[i] <= 0) continue;
    if (u < m->w[i]) return i;
    u -= m->w[i];
  }
  return last;
}

/* Input i has no more samples this epoch: apply the stop policy. */
static int input_ended(sf_node *node, mix *m, int i) {
  m->ended[i] = true;
  m->pending = -1;
  return m->stop == STOP_FIRST ? end_epoch(node, m) : 0;
}

/* After the last epoch: reads the inputs to their end, so that no branch waits for room for ever. */
static int drain(sf_node *node, mix *m) {
  bool open = false, got = false;
  for (int i = 0; i < m->n; i++) {
    if (m->closed[i]) continue;
    sf_item item;
    int r = sf_node_pop_port(node, i, &item);
    if (r == SF_EOF) {
      m->closed[i] = true;
      continue;
    }
    open = true;
    if (r == 0) sf_item_clear(&item), got = true;
  }
  return !open ? SF_EOF : got ? 0 : SF_EAGAIN;
}

static int step(sf_node *node) {
  mix *m = sf_node_priv(node);
  if (m->epoch >= m->end) return drain(node, m);
  if (!m->started) start_epoch(node, m);
  if (m->samples_per_epoch > 0 && m->emitted >= (uint64_t)m->samples_per_epoch) return end_epoch(node, m);
  if (m->pending < 0 && (m->pending = draw(m)) < 0) {
    bool all_closed = true;
    for (int i = 0; i < m->n; i++) all_closed &= m->closed[i];
    if (all_closed && m->emitted == 0) return drain(node, m);
    return end_epoch(node, m);
  }
  int i = m->pending;
  sf_item item;
  int r = sf_node_pop_port(node, i, &item); /* waits for the input it drew: arrival order never matters */
  if (r == SF_EOF) {
    m->closed[i] = true;
    return input_ended(node, m, i);
  }
  if (r < 0) return r;
  /* Leftovers of an epoch already ended here (cut, or stop: first) are dropped. */
  bool stale = item.epoch < m->epoch;
  if (item.kind == SF_ITEM_EPOCH_END) {
    if (stale || m->stop == STOP_NEVER) return 0; /* never: the input's next pass follows */
    return input_ended(node, m, i);
  }
  if (item.kind != SF_ITEM_SAMPLE || stale) {
    sf_item_clear(&item);
    return 0;
  }
  item.epoch = m->epoch;
  item.u.sample->epoch = m->epoch;
  uint64_t bytes = sf_item_nbytes(&item);
  sf_node_push(node, &item);
  sf_node_count_output(node, 1, bytes);
  sf_node_count_input(node, i, 1);
  m->emitted++;
  m->pending = -1;
  return 0;
}

static void uninit(sf_node *node) {
  mix *m = sf_node_priv(node);
  free(m->w);
  free(m->ended);
  free(m->closed);
}

const sf_stage_def sf_stage_mix = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "mix",
    .summary = "merges several inputs (datasets) by weight, seeded per epoch; stop policy first, longest or never",
    /* One port per name of `inputs:` (a template: in0, in1, ...), in that order; weights follow it. */
    .inputs = SF_PORTS({"in%u", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(mix),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
};
