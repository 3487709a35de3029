/* shard_source: expands the shard list, shuffles it per epoch and pass, hands each rank and worker its share. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/index.h"
#include "shardflow/shard_io.h"
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
  int visit;           /* option order: ORDER_* */
  int64_t block_size;  /* option: samples per block of order: block */
  char *index_dir;     /* option: where the shards' indexes are, or NULL: next to them */
  int64_t start;       /* option: positions of the first epoch consumed before (a resume) */
  int64_t deal;        /* option: positions a rank takes at a time in a round (the batch size), or 0 */
  /* order: global / block: every shard's index, and the samples before each shard (list.count + 1) */
  sf_shard_index *indexes;
  char **index_paths;  /* a remote shard's index file (its ranges carry it, to name it when stale), else NULL */
  uint64_t *before;
  uint64_t total;      /* samples of the dataset */
  uint64_t taken;      /* this slot's positions emitted in the current epoch */
  uint64_t skip;       /* the first epoch: this slot's positions consumed before the resume */
  char *samples;       /* option: FILE of dataset indices to read instead of the order */
  uint64_t *picks;     /* its indices, in order */
  size_t n_picks;
  bool picked;         /* samples is set: the epoch is picks */
  /* Feeding a mix by position (options set by the plan): the mix's node, this input's index and the weights */
  char *mix;
  int64_t mix_input;
  sf_float_list mix_weights;
  int64_t mix_samples; /* the mix's samples_per_epoch (the rank's) */
  uint64_t mix_seed;   /* the mix node's seed */
  uint64_t mix_taken;  /* this slot's mixed positions passed in the current epoch */
  uint64_t mix_at;     /* mixed positions before this one are counted in mix_drawn */
  uint64_t mix_drawn;  /* positions before mix_at that draw this input: its next sample's position */
  sf_float_list mix_sizes; /* the mix's inputs' dataset sizes: with stop: first (else empty) */
  uint64_t mix_size[SF_FLOAT_LIST_MAX];
  uint64_t mix_limit;  /* the mixed positions of epoch mix_limit_of - 1 (0: not found yet) */
  uint64_t mix_limit_of;
} shard_source;

enum { SAMPLING_SEQUENTIAL, SAMPLING_RESAMPLE };
enum { ORDER_SEQUENTIAL, ORDER_BLOCK, ORDER_GLOBAL };
static const char *const order_names[] = {"sequential", "block", "global", NULL};

/* One read of order: global / block covers at most this many samples and bytes. */
enum { RANGE_SAMPLES = 256, RANGE_BYTES = 8 << 20 };
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
     "with workers > 1 (Python's dataset gives each worker its share) unless deal is set (the rank's, its workers "
     "sharing its rounds); 0 = one pass over the rank's shards",
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
    {"order", SF_OPT_ENUM, offsetof(shard_source, visit), "sequential", 0, 0,
     "how an epoch visits samples. sequential = whole shards in a seeded order, each read front to back (a "
     "shuffle stage mixes their samples); global = a seeded permutation of all samples of the dataset every "
     "epoch, dealt to ranks and workers in turn (position p to slot p mod ranks x workers, or by deal), each "
     "sample read by its byte range (one read per sample); block = the dataset cut into blocks of block_size "
     "consecutive samples, blocks in a seeded order, dealt whole in turn (one read per block: a shuffle stage "
     "mixes within a window). global and block need uncompressed tar shards and their indexes (shardflow index; made "
     "and kept on first use when missing; remote shards' in index_dir); see docs/data.md",
     order_names},
    {"block_size", SF_OPT_COUNT, offsetof(shard_source, block_size), "256", 1, 1e9,
     "order: block: consecutive samples per block (one read each)", NULL},
    {"index_dir", SF_OPT_STRING, offsetof(shard_source, index_dir), NULL, 0, 0,
     "order: global / block: the directory holding the shards' indexes (shardflow index --out DIR); empty = "
     "next to each shard (SHARD.sfidx). A missing index is made by reading the shard once and kept there",
     NULL},
    {"start", SF_OPT_COUNT, offsetof(shard_source, start), "0", 0, 0,
     "order: global / block: samples of the first epoch consumed before, by all ranks together (a resume: "
     "Python's load_state_dict sets it); with deal set (or order: global and one worker a rank) it resumes at "
     "any world size and workers, else (order: block, deal: 0) only at the same ranks x workers",
     NULL},
    {"deal", SF_OPT_COUNT, offsetof(shard_source, deal), "0", 0, 1e9,
     "order: global / block: positions dealt to a rank at a time, the batch size (Python's Pipeline sets it): "
     "round i of the epoch's order gives rank r positions i x deal x ranks + r x deal onwards, read by worker i "
     "mod workers, so the rank's i-th batch is round i whatever the workers and the epoch's first k x deal x "
     "ranks positions are what every rank's first k batches consumed (a short last round is dealt a position "
     "at a time); 0 = position p to slot p mod ranks x workers",
     NULL},
    {"samples", SF_OPT_STRING, offsetof(shard_source, samples), NULL, 0, 0,
     "order: global / block: FILE of dataset indices (sample i of the shards in list order, one a line), read in "
     "this order every epoch instead of the permutation, dealt to ranks as it is (Python's shardflow.Dataset "
     "reads items with it); empty = the whole dataset",
     NULL},
    {"mix", SF_OPT_STRING, offsetof(shard_source, mix), NULL, 0, 0,
     "set by the plan, leave unset: the mix node this order: global source feeds when that mix deals by position "
     "(stop: never with samples_per_epoch, or stop: first; every input dealt: docs/resume.md); it then reads the samples of this "
     "input the mix draws at this rank and worker's positions",
     NULL},
    {"mix_input", SF_OPT_INT, offsetof(shard_source, mix_input), "-1", -1, 1e6,
     "set by the plan with mix: this source's index among the mix's inputs", NULL},
    {"mix_weights", SF_OPT_FLOAT_LIST, offsetof(shard_source, mix_weights), NULL, 0, 0,
     "set by the plan with mix: the mix's weights", NULL},
    {"mix_samples", SF_OPT_COUNT, offsetof(shard_source, mix_samples), "0", 0, 0,
     "set by the plan with mix: the mix's samples_per_epoch", NULL},
    {"mix_sizes", SF_OPT_FLOAT_LIST, offsetof(shard_source, mix_sizes), NULL, 0, 0,
     "set by the plan with mix when it has stop: first: the dataset size of each of its inputs, which ends the "
     "epoch where an input would run out",
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

/* The index of shard i: read (checked against the shard), else made from the shard and kept. */
static int load_index(sf_node *node, shard_source *s, size_t i, bool *said) {
  const char *url = s->list.urls[i];
  sf_error error, unsaved = {0};
  int r = sf_shard_index_load(&s->indexes[i], url, s->index_dir, &unsaved, &error);
  if (r < 0) return INIT_FAIL(node, r, error.url[0] ? error.url : url, "order: %s: %s",
                              order_names[s->visit], error.message);
  if (unsaved.code && !*said) {
    *said = true;
    sf_node_log(node, SF_LOG_WARNING, "%s; indexes are made again in every run until they can be kept "
                "(shardflow index --out DIR, and index_dir: DIR)", unsaved.message);
  }
  if (s->indexes[i].etag[0] && !(s->index_paths[i] = sf_shard_index_path(url, s->index_dir)))
    return INIT_FAIL(node, SF_ENOMEM, url, "out of memory for the index's path");
  /* Only the spans are needed from here on. */
  for (size_t k = 0; s->indexes[i].keys && k < s->indexes[i].count; k++) free(s->indexes[i].keys[k]);
  free(s->indexes[i].keys);
  s->indexes[i].keys = NULL;
  return 0;
}

/* shard_source's samples: the dataset indices to read, one a line. */
static int read_picks(sf_node *node, shard_source *s) {
  FILE *f = fopen(s->samples, "r");
  if (!f)
    return INIT_FAIL(node, SF_ENOENT, NULL, "samples \"%s\": %s; give a file of dataset indices", s->samples,
                     strerror(errno));
  char line[64];
  size_t cap = 0;
  s->picked = true;
  int r = 0;
  for (long no = 1; r == 0 && fgets(line, sizeof line, f); no++) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(line, &end, 10);
    if (end == line || errno || strspn(end, " \t\r\n") != strlen(end) || v >= s->total) {
      r = INIT_FAIL(node, SF_EOPTION, NULL, "samples \"%s\" line %ld is not a dataset index below %" PRIu64
                    " (the samples of the shards' indexes)", s->samples, no, s->total);
      break;
    }
    if (s->n_picks == cap) {
      cap = cap ? 2 * cap : 256;
      uint64_t *grown = realloc(s->picks, cap * sizeof *grown);
      if (!grown) {
        r = INIT_FAIL(node, SF_ENOMEM, NULL, "out of memory for the samples");
        break;
      }
      s->picks = grown;
    }
    s->picks[s->n_picks++] = v;
  }
  fclose(f);
  return r;
}

/* order: global / block: every shard's index, the dataset's size, and where a resumed epoch starts. */
static int init_indexed(sf_node *node, shard_source *s) {
  if (s->plan && s->plan[0])
    return INIT_FAIL(node, SF_EOPTION, NULL, "plan goes with order: sequential only; order: %s resumes with "
                     "start (the samples the epoch consumed, all ranks together)", order_names[s->visit]);
  if (s->sampling != SAMPLING_SEQUENTIAL)
    return INIT_FAIL(node, SF_EOPTION, NULL, "sampling: resample goes with order: sequential only; order: %s "
                     "repeats its permutation, reshuffled, to reach samples_per_epoch", order_names[s->visit]);
  s->indexes = calloc(s->list.count, sizeof *s->indexes);
  s->before = calloc(s->list.count + 1, sizeof *s->before);
  s->index_paths = calloc(s->list.count, sizeof *s->index_paths);
  if (!s->indexes || !s->before || !s->index_paths)
    return INIT_FAIL(node, SF_ENOMEM, NULL, "out of memory for %zu indexes", s->list.count);
  bool said = false;
  for (size_t i = 0; i < s->list.count; i++) {
    int r = load_index(node, s, i, &said);
    if (r < 0) return r;
    s->before[i + 1] = s->before[i] + s->indexes[i].count;
  }
  s->total = s->before[s->list.count];
  if (s->samples && s->samples[0]) {
    int r = read_picks(node, s);
    if (r < 0) return r;
  }
  if (s->total == 0)
    return INIT_FAIL(node, SF_ENOENT, NULL, "order: %s: the %zu shard(s) hold no sample; check the shard list",
                     order_names[s->visit], s->list.count);
  /* The positions before start were consumed; this slot's share of them is skipped. */
  uint64_t start = (uint64_t)s->start;
  if (start % s->stride != 0 && s->visit == ORDER_BLOCK && s->deal == 0)
    return INIT_FAIL(node, SF_EOPTION, NULL,
                     "start %" PRIu64 " is not a multiple of ranks x workers (%" PRIu64 "): order: block resumes "
                     "only at the world size and workers it was saved with, every rank having consumed the same "
                     "samples; set deal to the batch size (Python's Pipeline does) to resume at another layout",
                     start, s->stride);
  s->skip = s->visit == ORDER_BLOCK && s->deal == 0 ? start / s->stride : 0;
  if (s->mix && s->mix[0]) {
    bool sized = s->mix_sizes.n > 0;
    if (s->visit != ORDER_GLOBAL || s->deal == 0 || s->picked || s->samples_per_epoch > 0 ||
        (s->mix_samples <= 0 && !sized) || s->mix_input < 0 || s->mix_input >= s->mix_weights.n ||
        (sized && s->mix_sizes.n != s->mix_weights.n))
      return INIT_FAIL(node, SF_EOPTION, NULL,
                       "mix \"%s\" goes with order: global, deal > 0, no samples or samples_per_epoch of its own, "
                       "mix_samples > 0 or mix_sizes (one per input), and mix_input below the %d mix_weights; the "
                       "plan sets them: leave mix, mix_input, mix_weights, mix_samples and mix_sizes unset",
                       s->mix, s->mix_weights.n);
    for (int i = 0; i < s->mix_sizes.n; i++) {
      double v = s->mix_sizes.v[i];
      if (!(v >= 0 && v <= 0x1p53 && v == (double)(uint64_t)v))
        return INIT_FAIL(node, SF_EOPTION, NULL, "mix_sizes: %g is not a count of samples; leave it unset (the "
                         "plan sets it)", v);
      s->mix_size[i] = (uint64_t)v;
    }
    /* The plan counted this dataset from the same indexes; a shard changed in between would end the epoch
       elsewhere on another rank. */
    if (sized && s->mix_size[s->mix_input] != s->total)
      return INIT_FAIL(node, SF_EIO, NULL, "the shards' indexes hold %" PRIu64 " samples, the plan counted %" PRIu64
                       " a moment before: a shard or index changed while the pipeline started; start it again",
                       s->total, s->mix_size[s->mix_input]);
    s->mix_seed = sf_node_seed_named(node, s->mix);
  }
  return 0;
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
  /* order: global / block deal samples, not shards: a slot may outnumber the shards there. */
  if (s->sampling == SAMPLING_SEQUENTIAL && s->visit == ORDER_SEQUENTIAL && s->slot >= s->list.count)
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
  if (s->visit != ORDER_SEQUENTIAL) return init_indexed(node, s);
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
  (void)sf_shard_set_allow_pipe(shard, s->allow_pipe); /* cannot fail: sf_shard_new made it */
  if (keep) {
    (void)sf_shard_set_keep(shard, *keep, n_keep); /* takes it */
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

/* ---- order: global / block ---- */

/* The key of an epoch's (and pass's) permutation: the same on every rank, replica and worker. */
static uint64_t order_key(sf_node *node, const shard_source *s, uint64_t pass) {
  return sf_seed_mix(sf_seed_mix(sf_seed_mix(sf_node_seed(node), s->epoch), pass), 0x6f72646572 /* "order" */);
}

/*
 * The k-th position of this slot in the epoch's order (k counts from the epoch's start, skipped ones
 * included), or limit when the slot has no more. base: the positions consumed before (start, the first epoch).
 */
static uint64_t slot_position(const shard_source *s, uint64_t k, uint64_t base, uint64_t limit) {
  if (s->deal > 0) /* rounds of deal x ranks positions from base (include/shardflow/index.h) */
    return sf_index_deal_position(k, base, limit, (uint64_t)s->deal, (uint64_t)s->world_size, (uint64_t)s->rank,
                                  (uint64_t)s->workers, (uint64_t)s->worker);
  if (s->visit == ORDER_GLOBAL) return base + s->slot + k * s->stride;
  uint64_t run = (uint64_t)s->block_size; /* whole blocks in turn */
  return ((k / run) * s->stride + s->slot) * run + k % run;
}

/* Which sample of the dataset comes at position i of a pass of the order keyed by key. */
static uint64_t sample_at(const shard_source *s, uint64_t i, uint64_t key, bool shuffle) {
  uint64_t n = s->total;
  if (!shuffle) return i;
  if (s->visit == ORDER_GLOBAL) return sf_index_permute(i, n, key);
  /* Blocks of u samples in a seeded order; the last block (the dataset's tail) may be shorter. */
  uint64_t u = (uint64_t)s->block_size, blocks = (n + u - 1) / u, last = blocks - 1, tail = n - last * u;
  uint64_t at = sf_index_unpermute(last, blocks, key) * u; /* where the short block comes */
  if (i >= at && i < at + tail) return last * u + (i - at);
  if (i >= at + tail) i = i - tail + u;
  return sf_index_permute(i / u, blocks, key) * u + i % u;
}

/* The shard holding dataset sample j (the last shard whose first sample is at or before j). */
static size_t shard_of(const shard_source *s, uint64_t j) {
  size_t lo = 0, hi = s->list.count; /* before[lo] <= j < before[hi] */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->before[mid] <= j) lo = mid;
    else hi = mid;
  }
  return lo;
}

typedef struct placed {
  size_t shard;
  uint64_t sample; /* within the shard */
  uint64_t pass;
} placed;

static placed place(sf_node *node, const shard_source *s, uint64_t g) {
  uint64_t pass = s->picked ? 0 : g / s->total;
  uint64_t j = s->picked ? s->picks[g] : sample_at(s, g % s->total, order_key(node, s, pass), s->shuffle);
  size_t shard = shard_of(s, j);
  return (placed){shard, j - s->before[shard], pass};
}

static int push_range(sf_node *node, shard_source *s, placed at, uint64_t n, int64_t bytes);
static int step_mixed(sf_node *node, shard_source *s);

/*
 * order: global / block: the next samples of this slot, as one shard item with their byte range
 * (consecutive samples of one shard are read together), or the epoch's end.
 */
static int step_indexed(sf_node *node, shard_source *s) {
  if (s->mix && s->mix[0]) return step_mixed(node, s);
  if (s->epoch >= s->end) return SF_EOF;
  bool first = s->epoch == s->plan_epoch;
  /* samples_per_epoch is the rank's with deal (its workers share its rounds), else the slot's. */
  uint64_t per = s->deal > 0 ? (uint64_t)s->world_size : s->stride;
  uint64_t limit = s->picked                  ? s->n_picks
                   : s->samples_per_epoch > 0 ? (uint64_t)s->samples_per_epoch * per
                                              : s->total;
  uint64_t base = first && (s->deal > 0 || s->visit == ORDER_GLOBAL) ? (uint64_t)s->start : 0;
  uint64_t k = s->taken + (first ? s->skip : 0), g = slot_position(s, k, base, limit);
  if (g >= limit) {
    sf_item end = {.kind = SF_ITEM_EPOCH_END, .epoch = s->epoch};
    sf_node_push(node, &end);
    s->epoch++;
    s->taken = 0;
    return 0;
  }
  placed at = place(node, s, g);
  const int64_t *offsets = s->indexes[at.shard].offsets;
  uint64_t n = 1;
  int64_t bytes = offsets[at.sample + 1] - offsets[at.sample];
  while (n < RANGE_SAMPLES) {
    uint64_t next = slot_position(s, k + n, base, limit);
    if (next >= limit) break;
    placed more = place(node, s, next);
    if (more.shard != at.shard || more.pass != at.pass || more.sample != at.sample + n) break;
    int64_t span = offsets[more.sample + 1] - offsets[more.sample];
    if (bytes + span > RANGE_BYTES) break;
    bytes += span;
    n++;
  }
  int rc = push_range(node, s, at, n, bytes);
  if (rc == 0) s->taken += n;
  return rc;
}

/* Hands on n consecutive samples from at (bytes long) as one shard item with their byte range. */
static int push_range(sf_node *node, shard_source *s, placed at, uint64_t n, int64_t bytes) {
  const int64_t *offsets = s->indexes[at.shard].offsets;
  sf_shard *shard = sf_shard_new(s->list.urls[at.shard]);
  if (!shard) return SF_ENOMEM;
  shard->epoch = s->epoch;
  shard->index = at.shard;
  shard->pass = at.pass;
  (void)sf_shard_set_allow_pipe(shard, s->allow_pipe); /* cannot fail: sf_shard_new made it */
  sf_shard_range range = {.offset = offsets[at.sample], .length = bytes, .first_sample = at.sample, .samples = n,
                          .etag = s->indexes[at.shard].etag, .index = s->index_paths[at.shard]};
  int rc = sf_shard_set_range(shard, &range);
  if (rc < 0) {
    sf_shard_destroy(&shard);
    return rc;
  }
  sf_item item = {.kind = SF_ITEM_SHARD, .epoch = s->epoch, .u.shard = shard};
  sf_node_push(node, &item);
  sf_node_count_output(node, 1, 0);
  return 0;
}

/*
 * Feeding a mix by position: the next of this slot's mixed positions (dealt as the mix deals them) whose draw
 * is this input, as one sample. This input's k-th sample of the epoch (its own order, passes after the first
 * reshuffled) goes to the k-th mixed position drawing it, so each slot replays the draws from the epoch's start:
 * every rank and worker reads a disjoint part of one sequence, whatever the layout.
 */
static int step_mixed(sf_node *node, shard_source *s) {
  if (s->epoch >= s->end) return SF_EOF;
  int me = (int)s->mix_input, n = s->mix_weights.n;
  const double *w = s->mix_weights.v;
  if (s->mix_limit_of != s->epoch + 1) { /* the epoch's positions, as the mix finds them */
    s->mix_limit = s->mix_samples > 0 ? (uint64_t)s->mix_samples * (uint64_t)s->world_size : UINT64_MAX;
    if (s->mix_sizes.n > 0) s->mix_limit = sf_index_mix_end(s->mix_seed, s->epoch, w, s->mix_size, n, s->mix_limit);
    s->mix_limit_of = s->epoch + 1;
  }
  uint64_t limit = s->mix_limit;
  uint64_t base = s->epoch == s->plan_epoch ? (uint64_t)s->start : 0;
  for (;;) {
    uint64_t p = slot_position(s, s->mix_taken, base, limit);
    if (p >= limit) {
      sf_item end = {.kind = SF_ITEM_EPOCH_END, .epoch = s->epoch};
      sf_node_push(node, &end);
      s->epoch++;
      s->mix_taken = s->mix_at = s->mix_drawn = 0;
      return 0;
    }
    s->mix_taken++;
    for (; s->mix_at < p; s->mix_at++)
      s->mix_drawn += sf_index_mix_pick(s->mix_seed, s->epoch, s->mix_at, w, n) == me;
    s->mix_at = p + 1;
    if (sf_index_mix_pick(s->mix_seed, s->epoch, p, w, n) != me) continue;
    placed at = place(node, s, s->mix_drawn++);
    const int64_t *offsets = s->indexes[at.shard].offsets;
    return push_range(node, s, at, 1, offsets[at.sample + 1] - offsets[at.sample]);
  }
}

static int step(sf_node *node) {
  shard_source *s = sf_node_priv(node);
  if (s->visit != ORDER_SEQUENTIAL) return step_indexed(node, s);
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
  for (size_t i = 0; s->indexes && i < s->list.count; i++) sf_shard_index_clear(&s->indexes[i]);
  free(s->indexes);
  s->indexes = NULL;
  for (size_t i = 0; s->index_paths && i < s->list.count; i++) free(s->index_paths[i]);
  free(s->index_paths);
  s->index_paths = NULL;
  free(s->before);
  s->before = NULL;
  free(s->picks);
  s->picks = NULL;
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
