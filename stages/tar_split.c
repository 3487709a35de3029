/* tar_split: streams each shard (file, http(s), pipe) through libarchive and emits its samples one per step. */
#include <stddef.h>
#include <stdio.h>

#include "engine/tar_reader.h"
#include "shardflow/stage.h"

typedef struct tar_split {
  double connect_timeout; /* option, seconds */
  double stall_timeout;   /* option, seconds */
  sf_tar_reader *tar;     /* the open shard, or NULL */
  sf_shard *shard;        /* its descriptor (owned) */
  bool started;           /* an epoch has been seen */
  uint64_t epoch;         /* epoch of the shards being read */
  uint64_t emitted;       /* samples emitted in that epoch */
  bool cut;               /* an epoch was ended at samples_per_epoch ... */
  uint64_t cut_epoch;     /* ... this one: shards of it or older are dropped */
  uint64_t pass;          /* pass of the shards being read, within the epoch */
  uint64_t pass_samples;  /* samples that pass yielded so far */
} tar_split;

static const sf_option options[] = {
    {"connect_timeout", SF_OPT_DURATION, offsetof(tar_split, connect_timeout), "10s", 0.001,
     86400, "longest wait for an http(s) connection to a shard's server, in seconds", NULL},
    {"stall_timeout", SF_OPT_DURATION, offsetof(tar_split, stall_timeout), "30s", 1, 86400,
     "give up on an http(s) shard that sends under 1 byte/s for this long, in seconds "
     "(libcurl averages over ~5 s, so a stall shows that much later)", NULL},
    {NULL},
};

static void close_shard(tar_split *t) {
  sf_tar_reader_close(&t->tar);
  sf_shard_destroy(&t->shard);
}

static bool cancelled(void *node) { return sf_node_cancelled(node); }

static int open_shard(sf_node *node, tar_split *t, sf_item *item) {
  sf_shard *shard = item->u.shard;
  item->u.shard = NULL;
  item->kind = SF_ITEM_NONE;
  if (t->cut && item->epoch <= t->cut_epoch) {
    /* The epoch already has its samples_per_epoch samples. */
    sf_shard_destroy(&shard);
    return 0;
  }
  if (!t->started || item->epoch != t->epoch) {
    t->started = true;
    t->epoch = item->epoch;
    t->emitted = 0;
    t->pass = shard->pass;
    t->pass_samples = 0;
  }
  if (shard->pass != t->pass) {
    /* Repeating passes to reach samples_per_epoch: a pass without a single sample would repeat forever. */
    if (t->pass_samples == 0) {
      char url[512];
      snprintf(url, sizeof url, "%s", shard->url);
      sf_shard_destroy(&shard);
      sf_node_error(node, SF_ENOENT, url, NULL, -1,
                    "a whole pass over this rank's shards yielded no sample, so samples_per_epoch can "
                    "never be reached; check shard_source.urls and that members are named KEY.EXT");
      return SF_ENOENT; /* whatever the error policy */
    }
    t->pass = shard->pass;
    t->pass_samples = 0;
  }
  sf_shard_reader_options o = {
      .allow_pipe = shard->allow_pipe,
      .connect_timeout = t->connect_timeout,
      .stall_timeout = t->stall_timeout,
      .cancelled = cancelled,
      .cancel_opaque = node,
  };
  sf_error error;
  int rc = sf_tar_reader_open(&t->tar, shard->url, &o, &error);
  if (rc < 0) {
    sf_shard_destroy(&shard);
    if (sf_node_cancelled(node)) return SF_EOF; /* stopping: not an error of the shard */
    return sf_node_error(node, rc, error.url, NULL, error.offset, "%s", error.message);
  }
  t->shard = shard;
  return 0;
}

static uint64_t sample_bytes(const sf_sample *s) {
  uint64_t n = 0;
  for (int i = 0; i < s->n_fields; i++) n += sf_tensor_nbytes(&s->fields[i].tensor);
  return n;
}

/* Emits the next sample of the open shard, ending the epoch when it has its quota. */
static int read_sample(sf_node *node, tar_split *t) {
  sf_sample *sample = NULL;
  sf_error error;
  int rc = sf_tar_reader_next(t->tar, &sample, &error);
  if (rc == SF_EOF) {
    close_shard(t);
    return 0;
  }
  if (rc < 0) {
    sf_sample_destroy(&sample);
    if (sf_node_cancelled(node)) {
      close_shard(t);
      return SF_EOF; /* stopping: not an error of the shard */
    }
    bool recoverable = rc == SF_EDUP || rc == SF_ETOOBIG;
    /* A damaged stream cannot be resynchronised: the rest of the shard is abandoned. */
    if (!recoverable) close_shard(t);
    int policy = sf_node_error(node, rc, error.url, error.key, error.offset, "%s", error.message);
    if (policy < 0) return policy;
    if (recoverable) sf_node_count_skipped(node, 1);
    return 0;
  }
  sample->epoch = t->epoch;
  sample->shard_index = t->shard->index;
  sample->pass = t->shard->pass;
  uint64_t bytes = sample_bytes(sample);
  sf_item out = {.kind = SF_ITEM_SAMPLE, .epoch = t->epoch, .u.sample = sample};
  sf_node_push(node, &out);
  sf_node_count_output(node, 1, bytes);
  t->emitted++;
  t->pass_samples++;
  uint64_t quota = t->shard->samples_per_epoch;
  if (quota > 0 && t->emitted >= quota) {
    close_shard(t);
    sf_item end = {.kind = SF_ITEM_EPOCH_END, .epoch = t->epoch};
    sf_node_push(node, &end);
    sf_node_close_epoch(node, t->epoch);
    t->cut = true;
    t->cut_epoch = t->epoch;
  }
  return 0;
}

static int step(sf_node *node) {
  tar_split *t = sf_node_priv(node);
  if (t->tar) return read_sample(node, t);
  sf_item item;
  int rc = sf_node_pop(node, &item);
  if (rc < 0) return rc; /* SF_EAGAIN, or SF_EOF: no shard is open */
  switch (item.kind) {
  case SF_ITEM_SHARD: return open_shard(node, t, &item);
  case SF_ITEM_EPOCH_END:
    /* One-pass mode: the source ends epochs. An end for an epoch already cut is stale. */
    if (t->cut && item.epoch <= t->cut_epoch) return 0;
    sf_node_push(node, &item);
    return 0;
  default: sf_item_clear(&item); return 0;
  }
}

static void uninit(sf_node *node) { close_shard(sf_node_priv(node)); }

const sf_stage_def sf_stage_tar_split = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "tar_split",
    .summary = "streams tar shards (path, file://, http(s)://, pipe:) and groups members into "
               "samples by key",
    .input = SF_PORT_SHARD,
    .output = SF_PORT_SAMPLE,
    .priv_size = sizeof(tar_split),
    .options = options,
    .init = NULL,
    .step = step,
    .uninit = uninit,
};
