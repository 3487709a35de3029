/*
 * A test plugin: stage `split_public` splits the shards shard_source hands it through the public shard I/O API
 * (shardflow/shard_io.h) alone, as tar_split does: samples from the tar reader (the shard's keep list honoured),
 * or with `raw`, each shard's bytes from the shard reader as one sample (what a stage splitting another
 * container format starts from). Built out of tree against the installed headers (test_plugins.py).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <shardflow/plugin.h>
#include <shardflow/shard_io.h>
#include <shardflow/stage.h>

typedef struct split {
  bool raw;           /* option */
  sf_tar_reader *tar; /* the open shard, or NULL */
  sf_shard *shard;    /* its descriptor (owned) */
  uint64_t epoch;     /* its epoch */
} split;

static const sf_option split_options[] = {
    {"raw", SF_OPT_BOOL, offsetof(split, raw), "false", 0, 0,
     "one sample per shard: field bin holds its bytes (read with sf_shard_reader_read), field path the local path "
     "its URL names (sf_url_local_path), key the shard's index",
     NULL},
    {NULL},
};

static bool cancelled(void *node) { return sf_node_cancelled(node); }

static void close_shard(split *p) {
  sf_tar_reader_close(&p->tar);
  sf_shard_destroy(&p->shard);
}

/* Appends an encoded uint8 [n] field holding a copy of data. */
static int add_bytes(sf_sample *s, const char *name, const void *data, size_t n) {
  int64_t shape[1] = {(int64_t)n};
  sf_tensor t = {0};
  int rc = sf_tensor_alloc(&t, SF_DTYPE_UINT8, 1, shape);
  if (rc < 0) return rc;
  if (n) memcpy(sf_tensor_data(&t), data, n);
  return sf_sample_add_field(s, name, true, &t) ? 0 : SF_EINVAL;
}

/* The whole shard's bytes into *data (malloc'd), their count into *n. */
static int read_all(sf_node *node, const sf_shard *shard, uint8_t **data, size_t *n, sf_error *error) {
  sf_shard_reader_options o = {
      .allow_pipe = sf_shard_allow_pipe(shard), .cancelled = cancelled, .cancel_opaque = node, .cached_fd = -1};
  sf_shard_reader *r = NULL;
  int rc = sf_shard_reader_open(&r, shard->url, &o, error);
  size_t cap = 0;
  *data = NULL;
  *n = 0;
  while (rc == 0) {
    const void *chunk;
    ssize_t got = sf_shard_reader_read(r, &chunk, error);
    if (got <= 0) {
      rc = (int)got;
      break;
    }
    if (*n + (size_t)got > cap) {
      cap = (*n + (size_t)got) * 2;
      uint8_t *grown = realloc(*data, cap);
      if (!grown) {
        rc = sf_error_set(error, SF_ENOMEM, SF_AT(.url = shard->url), "out of memory");
        break;
      }
      *data = grown;
    }
    memcpy(*data + *n, chunk, (size_t)got);
    *n += (size_t)got;
  }
  if (rc == 0 && sf_shard_reader_offset(r) != (int64_t)*n)
    rc = sf_error_set(error, SF_EIO, SF_AT(.url = shard->url), "reader's offset %lld, %zu bytes read",
                      (long long)sf_shard_reader_offset(r), *n);
  sf_shard_reader_close(&r);
  return rc;
}

/* raw: the shard as one sample. Takes shard. */
static int emit_raw(sf_node *node, sf_shard *shard, uint64_t epoch) {
  uint8_t *data = NULL;
  size_t n = 0;
  sf_error error = {.offset = -1};
  int rc = read_all(node, shard, &data, &n, &error);
  sf_sample *s = rc == 0 ? sf_sample_new() : NULL;
  if (rc == 0 && !s) rc = SF_ENOMEM;
  char key[32];
  snprintf(key, sizeof key, "%llu", (unsigned long long)shard->index);
  char *path = sf_url_local_path(shard->url);
  if (rc == 0) rc = sf_sample_set_key(s, key, strlen(key));
  if (rc == 0) rc = add_bytes(s, "bin", data, n);
  if (rc == 0) rc = add_bytes(s, "path", path ? path : "", path ? strlen(path) : 0);
  free(path);
  free(data);
  if (rc < 0) {
    sf_sample_destroy(&s);
    int policy = sf_node_error(node, rc, shard->url, NULL, error.offset, "%s", error.message);
    sf_shard_destroy(&shard);
    return policy;
  }
  s->epoch = epoch;
  s->shard_index = shard->index;
  sf_shard_destroy(&shard);
  sf_item out = {.kind = SF_ITEM_SAMPLE, .epoch = epoch, .u.sample = s};
  sf_node_push(node, &out);
  sf_node_count_output(node, 1, n);
  return 0;
}

static int split_step(sf_node *node) {
  split *p = sf_node_priv(node);
  if (!p->tar) {
    sf_item item;
    int rc = sf_node_pop(node, &item);
    if (rc < 0) return rc; /* SF_EAGAIN, SF_EOF */
    if (item.kind != SF_ITEM_SHARD) {
      sf_node_push(node, &item); /* an epoch's end */
      return 0;
    }
    sf_shard *shard = item.u.shard;
    if (p->raw) return emit_raw(node, shard, item.epoch);
    sf_shard_reader_options o = {
        .allow_pipe = sf_shard_allow_pipe(shard), .cancelled = cancelled, .cancel_opaque = node, .cached_fd = -1};
    sf_error error;
    rc = sf_tar_reader_open(&p->tar, shard->url, &o, &error);
    if (rc < 0) {
      sf_shard_destroy(&shard);
      return sf_node_error(node, rc, error.url, NULL, error.offset, "%s", error.message);
    }
    p->shard = shard;
    p->epoch = item.epoch;
    return 0;
  }
  sf_sample *s = NULL;
  sf_error error;
  int rc = sf_tar_reader_next(p->tar, &s, &error);
  if (rc == SF_EOF) {
    close_shard(p);
    return 0;
  }
  if (rc < 0) {
    if (!s) close_shard(p); /* the shard cannot go on */
    sf_sample_destroy(&s);
    return sf_node_error(node, rc, error.url, error.key, error.offset, "%s", error.message);
  }
  if (!sf_shard_keeps(p->shard, s->index)) {
    sf_sample_destroy(&s);
    return 0;
  }
  s->epoch = p->epoch;
  s->shard_index = p->shard->index;
  s->pass = p->shard->pass;
  sf_item out = {.kind = SF_ITEM_SAMPLE, .epoch = p->epoch, .u.sample = s};
  sf_node_push(node, &out);
  sf_node_count_output(node, 1, 0);
  return 0;
}

static void split_uninit(sf_node *node) { close_shard(sf_node_priv(node)); }

static const sf_stage_def split_stage = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "split_public",
    .summary = "test stage: tar_split's work through the public shard I/O API",
    .inputs = SF_PORTS({"in", SF_PORT_SHARD}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(split),
    .options = split_options,
    .step = split_step,
    .uninit = split_uninit,
};

static const sf_stage_def *const split_stages[] = {&split_stage, NULL};

static const sf_plugin split_plugin = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "shard_read",
    .build_id = "shard_read test",
    .stages = split_stages,
};

SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void);
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void) { return &split_plugin; }
