/* mix: merges the samples of several branches (datasets) by weight, seeded by the epoch (by position when dealt). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/index.h"
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
  /* By position (deal > 0, set by the plan from the inputs' shard_sources): the draws are a function of the
     mixed position, dealt to ranks and workers as the inputs deal theirs */
  int64_t deal, start, workers, worker, rank, world_size; /* options */
  double *raw;               /* [n] the weights as written (1 each when none), what the inputs replay (owned) */
  uint64_t first;            /* the first epoch: start applies to it */
  sf_float_list sizes;       /* option: with stop: first, each input's dataset size (set by the plan) */
  uint64_t *size;            /* [n] sizes as integers (owned) */
  uint64_t limit;            /* the mixed positions of the epoch being mixed (all ranks') */
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
    {"deal", SF_OPT_COUNT, offsetof(mix, deal), "0", 0, 1e9,
     "set by the plan, leave unset: with stop: never and samples_per_epoch, or stop: first, over inputs that are each a "
     "shard_source of order: global with deal, their deal; the input of mixed position p of an epoch is then a "
     "weighted choice seeded by (seed, epoch, p), positions dealt to ranks and workers as shard_source deals "
     "them, so a count of consumed positions resumes at any layout (docs/resume.md); 0 = draws from one random "
     "stream per epoch",
     NULL},
    {"sizes", SF_OPT_FLOAT_LIST, offsetof(mix, sizes), NULL, 0, 0,
     "set by the plan with deal and stop: first: each input's dataset size (samples, from its indexes); the epoch "
     "is the mixed positions before the first that would draw an input past its size (capped by "
     "samples_per_epoch x ranks when set)",
     NULL},
    {"start", SF_OPT_COUNT, offsetof(mix, start), "0", 0, 0,
     "set by the plan with deal: the inputs' start (mixed positions of the first epoch consumed before)", NULL},
    {"workers", SF_OPT_COUNT, offsetof(mix, workers), "1", 1, 1e6, "set by the plan with deal: the inputs' workers",
     NULL},
    {"worker", SF_OPT_INT, offsetof(mix, worker), "0", 0, 1e6, "set by the plan with deal: the inputs' worker", NULL},
    {"rank", SF_OPT_INT, offsetof(mix, rank), "-1", -1, 1e6,
     "set by the plan with deal: the inputs' rank (-1 = the pipeline's)", NULL},
    {"world_size", SF_OPT_INT, offsetof(mix, world_size), "-1", -1, 1e6,
     "set by the plan with deal: the inputs' world_size (-1 = the pipeline's)", NULL},
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
  if (m->deal > 0) {
    if (!(m->stop == STOP_NEVER && m->samples_per_epoch > 0) && !(m->stop == STOP_FIRST && m->sizes.n == m->n))
      return sf_node_option_error(node, "deal", "mixing by position goes with stop: never and samples_per_epoch, "
                                  "or stop: first and one size per input; leave deal and sizes unset (the plan "
                                  "sets them)");
    if (m->rank < 0) m->rank = sf_node_rank(node);
    if (m->world_size < 0) m->world_size = sf_node_world_size(node);
    if (m->world_size < 1 || m->rank >= m->world_size || m->worker >= m->workers)
      return sf_node_option_error(node, "deal", "rank %lld of %lld, worker %lld of %lld is not a slot; leave them "
                                  "unset (the plan copies the inputs')", (long long)m->rank,
                                  (long long)m->world_size, (long long)m->worker, (long long)m->workers);
    if (!(m->raw = calloc((size_t)m->n, sizeof *m->raw))) {
      sf_node_error(node, SF_ENOMEM, NULL, NULL, -1, "out of memory for %d inputs", m->n);
      return SF_ENOMEM;
    }
    for (int i = 0; i < m->n; i++) m->raw[i] = m->weights.n ? m->weights.v[i] : 1.0;
    if (m->stop == STOP_FIRST) {
      if (!(m->size = calloc((size_t)m->n, sizeof *m->size))) {
        sf_node_error(node, SF_ENOMEM, NULL, NULL, -1, "out of memory for %d inputs", m->n);
        return SF_ENOMEM;
      }
      for (int i = 0; i < m->n; i++) {
        if (!(m->sizes.v[i] >= 0 && m->sizes.v[i] <= 0x1p53 && m->sizes.v[i] == floor(m->sizes.v[i])))
          return sf_node_option_error(node, "sizes", "%g is not a count of samples; leave sizes unset (the plan "
                                      "sets it)", m->sizes.v[i]);
        m->size[i] = (uint64_t)m->sizes.v[i];
      }
    }
  }
  m->epoch = m->first = sf_node_first_epoch(node);
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

/* Hands on input i's sample *item as the mix's next. */
static int emit(sf_node *node, mix *m, int i, sf_item *item) {
  uint64_t bytes = sf_item_nbytes(item);
  sf_node_push(node, item);
  sf_node_count_output(node, 1, bytes);
  sf_node_count_input(node, i, 1);
  m->emitted++;
  m->pending = -1;
  return 0;
}

/*
 * By position: this slot's emitted-th mixed position p draws input sf_index_mix_pick(seed, epoch, p), whose
 * shard_source sends exactly its samples of this slot's draws, in order; anything else means the two disagree.
 * The epoch's positions: samples_per_epoch x ranks, or with stop: first those before an input would run out.
 */
static int step_dealt(sf_node *node, mix *m) {
  if (!m->started) {
    start_epoch(node, m);
    m->limit = m->samples_per_epoch > 0 ? (uint64_t)m->samples_per_epoch * (uint64_t)m->world_size : UINT64_MAX;
    if (m->stop == STOP_FIRST)
      m->limit = sf_index_mix_end(sf_node_seed(node), m->epoch, m->raw, m->size, m->n, m->limit);
  }
  if (m->pending < 0) {
    uint64_t limit = m->limit;
    uint64_t base = m->epoch == m->first ? (uint64_t)m->start : 0;
    uint64_t p = sf_index_deal_position(m->emitted, base, limit, (uint64_t)m->deal, (uint64_t)m->world_size,
                                        (uint64_t)m->rank, (uint64_t)m->workers, (uint64_t)m->worker);
    if (p >= limit) return end_epoch(node, m);
    m->pending = sf_index_mix_pick(sf_node_seed(node), m->epoch, p, m->raw, m->n);
  }
  int i = m->pending;
  sf_item item;
  int r = sf_node_pop_port(node, i, &item);
  if (r < 0 && r != SF_EOF) return r;
  if (r == 0 && item.epoch < m->epoch && item.kind == SF_ITEM_EPOCH_END) return 0; /* the input's last epoch's end */
  if (r == SF_EOF || item.kind != SF_ITEM_SAMPLE || item.epoch != m->epoch) {
    if (r == 0) sf_item_clear(&item);
    return sf_node_error(node, SF_EINVAL, NULL, NULL, -1,
                         "input %d sent %s where epoch %llu's mixed position drew its next sample: mixing by "
                         "position needs each input's shard_source to be dealt as the plan set it (mix, deal, "
                         "start, workers); report this with the graph", i,
                         r == SF_EOF ? "its end" : item.kind == SF_ITEM_SAMPLE ? "another epoch's sample"
                                                                              : "an epoch's end",
                         (unsigned long long)m->epoch);
  }
  return emit(node, m, i, &item);
}

static int step(sf_node *node) {
  mix *m = sf_node_priv(node);
  if (m->epoch >= m->end) return drain(node, m);
  if (m->deal > 0) return step_dealt(node, m);
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
  return emit(node, m, i, &item);
}

static void uninit(sf_node *node) {
  mix *m = sf_node_priv(node);
  free(m->w);
  free(m->ended);
  free(m->closed);
  free(m->raw);
  free(m->size);
}

const sf_stage_def sf_stage_mix = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "mix",
    .summary = "merges several inputs (datasets) by weight, seeded per epoch (per position over dealt order: global "
               "inputs, stop: first or never); stop policy first, longest or never",
    /* One port per name of `inputs:` (a template: in0, in1, ...), in that order; weights follow it. */
    .inputs = SF_PORTS({"in%u", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(mix),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
};
