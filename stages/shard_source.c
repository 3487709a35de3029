/* shard_source: expands the shard list, shuffles it per epoch and pass, hands each rank and worker its share. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_list.h"
#include "url.h"
#include "shardflow/stage.h"

/* One shard of a resume plan and the sample indices to read from it, ascending. */
typedef struct plan_shard {
  uint32_t index;
  uint64_t *keep;
  size_t n_keep, cap;
} plan_shard;

typedef struct shard_source {
  char *urls;                /* option */
  bool shuffle;              /* option */
  int64_t rank;              /* option; -1 = the pipeline's rank */
  int64_t world_size;        /* option; -1 = the pipeline's world size */
  int64_t worker;            /* option */
  int64_t workers;           /* option */
  int64_t samples_per_epoch; /* option; 0 = one pass per epoch */
  bool allow_pipe;           /* option */
  int sampling;              /* option: SAMPLING_* */
  char *plan;                /* option: resume plan file */
  sf_shard_list list;
  sf_rng draws;      /* resample: this rank and worker's draws of the current epoch */
  uint32_t *order;   /* shard indices of the current (epoch, pass), all ranks' */
  uint64_t slot;     /* first position of this rank and worker in order */
  uint64_t stride;   /* world_size * workers */
  uint64_t end;      /* epoch to stop at, UINT64_MAX = never */
  uint64_t epoch, pass, next; /* next position in order to emit */
  bool ordered;      /* order holds (epoch, pass) */
  plan_shard *planned; /* the plan's shards in file order; their keep arrays move into the shards */
  size_t n_planned, next_planned;
  uint64_t plan_epoch; /* the epoch the plan replaces: the pipeline's first */
} shard_source;

enum { SAMPLING_SEQUENTIAL, SAMPLING_RESAMPLE };
static const char *const sampling_names[] = {"sequential", "resample", NULL};

static const sf_option options[] = {
    {"urls", SF_OPT_STRING, offsetof(shard_source, urls), NULL, 0, 0,
     "shard list: brace patterns like train-{000000..000649}.tar, joined with '::', or @FILE",
     NULL},
    {"shuffle", SF_OPT_BOOL, offsetof(shard_source, shuffle), "true", 0, 0,
     "shuffle the shard order every epoch and pass (same order on every rank)", NULL},
    {"rank", SF_OPT_INT, offsetof(shard_source, rank), "-1", -1, 1e6,
     "this rank's index; -1 = the pipeline's rank (RANK)", NULL},
    {"world_size", SF_OPT_INT, offsetof(shard_source, world_size), "-1", -1, 1e6,
     "number of ranks; -1 = the pipeline's world size (WORLD_SIZE)", NULL},
    {"worker", SF_OPT_INT, offsetof(shard_source, worker), "0", 0, 1e6,
     "this loader worker's index within the rank", NULL},
    {"workers", SF_OPT_COUNT, offsetof(shard_source, workers), "1", 1, 1e6,
     "loader workers per rank, each reading its own shards", NULL},
    {"samples_per_epoch", SF_OPT_COUNT, offsetof(shard_source, samples_per_epoch), "0", 0, 0,
     "samples per epoch on every rank (shards repeat until tar_split cuts the epoch), of this worker "
     "with workers > 1 (Python's dataset gives each worker its share); 0 = one pass over the rank's shards",
     NULL},
    {"allow_pipe", SF_OPT_BOOL, offsetof(shard_source, allow_pipe), "false", 0, 0,
     "allow pipe:CMD URLs (they run a shell command)", NULL},
    {"sampling", SF_OPT_ENUM, offsetof(shard_source, sampling), "sequential", 0, 0,
     "sequential = each rank and worker reads its share of the (shuffled) list; resample = every rank and "
     "worker draws shards with replacement from the whole list, seeded by seed, rank, worker and epoch "
     "(WebDataset's ResampledShards), endlessly until samples_per_epoch or a mix's cut ends the epoch",
     sampling_names},
    {"plan", SF_OPT_STRING, offsetof(shard_source, plan), NULL, 0, 0,
     "resume plan FILE (written by Python's elastic load_state_dict; docs/resume.md): the first epoch "
     "reads only the listed samples, lines `SHARD_INDEX SAMPLE_INDEX`, instead of this rank's share; "
     "later epochs are dealt as usual",
     NULL},
    {NULL},
};

/* init failures must stop the pipeline whatever the error policy, so the code is returned as is. */
#define INIT_FAIL(node, code, url, ...) \
  (sf_node_error(node, code, url, NULL, -1, __VA_ARGS__), (code))

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Reads the plan file: lines `SHARD_INDEX SAMPLE_INDEX`, each shard's lines together, '#' comments. */
static int read_plan(sf_node *node, shard_source *s) {
  FILE *f = fopen(s->plan, "r");
  if (!f)
    return INIT_FAIL(node, SF_ENOENT, NULL, "plan \"%s\": %s; give the file load_state_dict wrote",
                     s->plan, strerror(errno));
  char line[128];
  int r = 0;
  for (long no = 1; r == 0 && fgets(line, sizeof line, f); no++) {
    char *p = line, *end;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '#' || *p == '\n' || *p == '\0') continue;
    errno = 0;
    unsigned long long shard = strtoull(p, &end, 10), sample = 0;
    bool ok = end != p && !errno;
    if (ok) sample = strtoull(p = end, &end, 10);
    ok = ok && end != p && !errno && strspn(end, " \t\r\n") == strlen(end) && shard < s->list.count;
    plan_shard *last = s->n_planned ? &s->planned[s->n_planned - 1] : NULL;
    if (ok && (!last || last->index != shard)) {
      for (size_t i = 0; ok && i < s->n_planned; i++) ok = s->planned[i].index != shard;
      if (!ok) {
        r = INIT_FAIL(node, SF_EOPTION, NULL,
                      "plan \"%s\" line %ld: shard %llu appears again after other shards; list each "
                      "shard's samples together", s->plan, no, shard);
        break;
      }
      plan_shard *grown = realloc(s->planned, (s->n_planned + 1) * sizeof *grown);
      if (!grown) { r = INIT_FAIL(node, SF_ENOMEM, NULL, "out of memory for the plan"); break; }
      s->planned = grown;
      last = &s->planned[s->n_planned++];
      *last = (plan_shard){.index = (uint32_t)shard};
    }
    if (!ok) {
      r = INIT_FAIL(node, SF_EOPTION, NULL,
                    "plan \"%s\" line %ld is not `SHARD_INDEX SAMPLE_INDEX` with a shard index below %zu; "
                    "give the file load_state_dict wrote for this graph", s->plan, no, s->list.count);
      break;
    }
    if (last->n_keep == last->cap) {
      size_t cap = last->cap ? 2 * last->cap : 64;
      uint64_t *grown = realloc(last->keep, cap * sizeof *grown);
      if (!grown) { r = INIT_FAIL(node, SF_ENOMEM, NULL, "out of memory for the plan"); break; }
      last->keep = grown;
      last->cap = cap;
    }
    last->keep[last->n_keep++] = sample;
  }
  fclose(f);
  for (size_t i = 0; i < s->n_planned; i++)
    qsort(s->planned[i].keep, s->planned[i].n_keep, sizeof(uint64_t), cmp_u64);
  return r;
}

static int init(sf_node *node) {
  shard_source *s = sf_node_priv(node);
  if (s->rank < 0) s->rank = sf_node_rank(node);
  if (s->world_size < 0) s->world_size = sf_node_world_size(node);
  if (s->world_size < 1)
    return INIT_FAIL(node, SF_EOPTION, NULL, "world_size is %" PRId64 "; it must be at least 1",
                     s->world_size);
  if (s->rank >= s->world_size)
    return INIT_FAIL(node, SF_EOPTION, NULL,
                     "rank %" PRId64 " is out of range for world_size %" PRId64
                     "; rank must be 0..%" PRId64,
                     s->rank, s->world_size, s->world_size - 1);
  if (s->worker >= s->workers)
    return INIT_FAIL(node, SF_EOPTION, NULL,
                     "worker %" PRId64 " is out of range for workers %" PRId64
                     "; worker must be 0..%" PRId64,
                     s->worker, s->workers, s->workers - 1);
  if (!s->urls || !s->urls[0])
    return INIT_FAIL(node, SF_EOPTION, NULL,
                     "urls is empty; give the shard list, e.g. urls: train-{000000..000649}.tar");

  sf_error error;
  int r = sf_shard_list_expand(&s->list, s->urls, &error);
  if (r == SF_EINVAL) r = SF_EOPTION; /* a malformed pattern is a bad option value */
  if (r) return INIT_FAIL(node, r, error.url[0] ? error.url : NULL, "urls: %s", error.message);
  if (s->list.count == 0)
    return INIT_FAIL(node, SF_ENOENT, NULL,
                     "urls \"%.200s\" expands to no shard; check the list file", s->urls);

  /* A mistake in the graph, found before any shard is read rather than once per shard. */
  for (size_t i = 0; !s->allow_pipe && i < s->list.count; i++)
    if (sf_url_kind_of(s->list.urls[i]) == SF_URL_PIPE)
      return INIT_FAIL(node, SF_EDENIED, s->list.urls[i],
                       "pipe: URLs run shell commands and are off by default; set `allow_pipe: true` on "
                       "shard_source if you trust the shard list");

  s->stride = (uint64_t)s->world_size * (uint64_t)s->workers;
  s->slot = (uint64_t)s->rank * (uint64_t)s->workers + (uint64_t)s->worker;
  if (s->sampling == SAMPLING_SEQUENTIAL && s->slot >= s->list.count)
    return INIT_FAIL(node, SF_EOPTION, NULL,
                     "rank %" PRId64 " of %" PRId64 " (worker %" PRId64 " of %" PRId64
                     ") gets no shard: %zu shards for %" PRId64 " ranks x %" PRId64
                     " workers; use fewer ranks/workers or more shards",
                     s->rank, s->world_size, s->worker, s->workers, s->list.count,
                     s->world_size, s->workers);
  /* The list holds at most 10,000,000 URLs, so 32-bit indices suffice and halve the memory. */
  s->order = malloc(s->list.count * sizeof *s->order);
  if (!s->order) return INIT_FAIL(node, SF_ENOMEM, NULL, "out of memory for %zu shards", s->list.count);
  s->epoch = sf_node_first_epoch(node);
  uint64_t epochs = sf_node_epochs(node);
  s->end = epochs == 0 ? UINT64_MAX : epochs; /* epochs counts from 0: a resumed run ends where the first would */
  s->next = s->slot;
  s->plan_epoch = s->epoch;
  if (s->plan && s->plan[0]) {
    if (s->samples_per_epoch > 0)
      return INIT_FAIL(node, SF_EOPTION, NULL,
                       "plan and samples_per_epoch do not go together: a plan lists the epoch's samples; "
                       "set samples_per_epoch: 0");
    return read_plan(node, s);
  }
  return 0;
}

/* Every rank computes the same order: it depends only on the node's seed, the epoch and the pass. */
static void make_order(sf_node *node, shard_source *s) {
  size_t n = s->list.count;
  for (size_t i = 0; i < n; i++) s->order[i] = (uint32_t)i;
  if (s->shuffle) {
    sf_rng rng;
    sf_rng_seed(&rng, sf_seed_mix(sf_seed_mix(sf_node_seed(node), s->epoch), s->pass));
    for (size_t i = n - 1; i > 0; i--) {
      size_t j = (size_t)sf_rng_below(&rng, i + 1);
      uint32_t t = s->order[i];
      s->order[i] = s->order[j];
      s->order[j] = t;
    }
  }
  s->ordered = true;
}

static void next_epoch(shard_source *s) {
  s->epoch++;
  s->pass = 0;
  s->next = s->slot;
  s->ordered = false;
}

/*
 * Hands on a shard of the current epoch; pass counts whole list lengths of shards. keep: the samples
 * of an elastic resume's plan to read (moved into the shard), or NULL for all of them.
 */
static int push_shard(sf_node *node, shard_source *s, uint32_t index, uint64_t **keep, size_t n_keep) {
  sf_shard *shard = sf_shard_new(s->list.urls[index]);
  if (!shard) return SF_ENOMEM;
  shard->epoch = s->epoch;
  shard->index = index;
  shard->pass = s->pass;
  shard->samples_per_epoch = (uint64_t)s->samples_per_epoch;
  shard->allow_pipe = s->allow_pipe;
  if (keep) {
    shard->keep = *keep;
    shard->n_keep = n_keep;
    *keep = NULL;
  }
  sf_item item = {.kind = SF_ITEM_SHARD, .epoch = s->epoch, .u.shard = shard};
  sf_node_push(node, &item);
  sf_node_count_output(node, 1, 0);
  return 0;
}

/*
 * sampling: resample: shards drawn with replacement, uniformly from the whole list, from a stream that
 * depends only on the node's seed, the epoch, the rank and the worker (so ranks differ, and a resumed
 * run draws the same shards).  Endless: the epoch ends when it is closed.
 */
static int resample(sf_node *node, shard_source *s) {
  if (!s->ordered) {
    uint64_t seed = sf_seed_mix(sf_seed_mix(sf_node_seed(node), s->epoch), (uint64_t)s->rank);
    sf_rng_seed(&s->draws, sf_seed_mix(seed, (uint64_t)s->worker));
    s->ordered = true;
    s->next = 0;
  }
  uint32_t index = (uint32_t)sf_rng_below(&s->draws, s->list.count);
  s->pass = s->next++ / s->list.count;
  return push_shard(node, s, index, NULL, 0);
}

/* The planned epoch: the plan's shards, each with the samples to keep, then the epoch's end. */
static int step_plan(sf_node *node, shard_source *s) {
  if (s->next_planned == s->n_planned) {
    sf_item end = {.kind = SF_ITEM_EPOCH_END, .epoch = s->epoch};
    sf_node_push(node, &end);
    next_epoch(s);
    return 0;
  }
  plan_shard *p = &s->planned[s->next_planned++];
  return push_shard(node, s, p->index, &p->keep, p->n_keep);
}

static int step(sf_node *node) {
  shard_source *s = sf_node_priv(node);
  if (s->plan && s->plan[0] && s->epoch == s->plan_epoch && s->epoch < s->end) return step_plan(node, s);
  /* With samples_per_epoch, tar_split ends the epoch (and sends its EPOCH_END) by closing it. */
  bool endless = s->samples_per_epoch > 0 || s->sampling == SAMPLING_RESAMPLE;
  while (endless && s->epoch < s->end && sf_node_epochs_closed(node) > s->epoch) next_epoch(s);
  if (s->epoch >= s->end) return SF_EOF;
  if (s->sampling == SAMPLING_RESAMPLE) return resample(node, s);
  if (s->next >= s->list.count) {
    if (s->samples_per_epoch == 0) {
      sf_item end = {.kind = SF_ITEM_EPOCH_END, .epoch = s->epoch};
      sf_node_push(node, &end);
      next_epoch(s);
      return 0;
    }
    s->pass++; /* repeat the share, reshuffled, until the epoch is closed */
    s->next = s->slot;
    s->ordered = false;
  }
  if (!s->ordered) make_order(node, s);
  int r = push_shard(node, s, s->order[s->next], NULL, 0);
  if (r == 0) s->next += s->stride;
  return r;
}

static void uninit(sf_node *node) {
  shard_source *s = sf_node_priv(node);
  sf_shard_list_clear(&s->list);
  free(s->order);
  s->order = NULL;
  for (size_t i = 0; i < s->n_planned; i++) free(s->planned[i].keep);
  free(s->planned);
  s->planned = NULL;
}

const sf_stage_def sf_stage_shard_source = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "shard_source",
    .summary = "expands the shard list, shuffles it per epoch with the graph seed, splits it by "
               "rank and worker",
    .outputs = SF_PORTS({"out", SF_PORT_SHARD}),
    .priv_size = sizeof(shard_source),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
};
