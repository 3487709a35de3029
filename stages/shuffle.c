/* shuffle: a bounded buffer of samples with an initial fill, seeded per epoch (WebDataset's shuffle). */
#include <stddef.h>
#include <stdlib.h>

#include "shardflow/stage.h"

typedef struct shuffle {
  int64_t buffer_size;  /* option */
  int64_t initial;      /* option */
  sf_sample **buffer;
  int64_t count;
  uint64_t epoch;       /* epoch whose samples the buffer holds */
  uint64_t since_initial; /* samples added after the initial fill, for the two-in-one-out growth */
  bool seeded;
  bool draining;        /* an epoch end or EOF arrived: empty the buffer first */
  sf_item pending_end;  /* the epoch-end marker to forward once drained */
  sf_rng rng;
  /* The next emission's index, drawn early for a full buffer (see emit_one), and the rng before it. */
  bool drawn;
  uint64_t next;
  sf_rng before;
} shuffle;

static const sf_option options[] = {
    {"buffer_size", SF_OPT_COUNT, offsetof(shuffle, buffer_size), "10000", 1, 1e8,
     "samples held in the buffer; 1 turns shuffling off", NULL},
    {"initial", SF_OPT_COUNT, offsetof(shuffle, initial), "0", 0, 1e8,
     "samples to collect before the first one leaves (0 = buffer_size); after it the buffer keeps "
     "growing to buffer_size, one out for every two in", NULL},
    {NULL},
};

static int init(sf_node *node) {
  shuffle *s = sf_node_priv(node);
  if (s->initial == 0 || s->initial > s->buffer_size) s->initial = s->buffer_size;
  s->buffer = calloc((size_t)s->buffer_size, sizeof *s->buffer);
  return s->buffer ? 0 : SF_ENOMEM;
}

static void reseed(sf_node *node, shuffle *s, uint64_t epoch) {
  s->drawn = false;
  sf_rng_seed(&s->rng, sf_seed_mix(sf_node_seed(node), epoch));
  s->epoch = epoch;
  s->seeded = true;
}

/* Swap a random element to the end and hand it on. */
static void emit_one(sf_node *node, shuffle *s) {
  uint64_t i;
  if (s->drawn && s->count == s->buffer_size) {
    i = s->next;
  } else {
    if (s->drawn) s->rng = s->before; /* drawn for a full buffer, but the buffer drains: as if never drawn */
    i = sf_rng_below(&s->rng, (uint64_t)s->count);
  }
  s->drawn = false;
  sf_sample *out = s->buffer[i];
  s->buffer[i] = s->buffer[--s->count];
  sf_item item = {.kind = SF_ITEM_SAMPLE, .epoch = out->epoch, .u.sample = out};
  sf_node_count_output(node, 1, sf_item_nbytes(&item));
  sf_node_push(node, &item);
  /*
   * A full buffer emits again after one more sample, from buffer_size samples: draw that index now
   * (the same draw, one step early) and prefetch its sample, whose header and fields are otherwise
   * a cache miss in a 10,000-sample buffer (most of this stage's time in the CIFAR graph).
   */
  if (s->count == s->buffer_size - 1) {
    s->before = s->rng;
    s->next = sf_rng_below(&s->rng, (uint64_t)s->buffer_size);
    s->drawn = true;
    if (s->next < (uint64_t)s->count)
      for (int line = 0; line < 8; line++) __builtin_prefetch((const char *)s->buffer[s->next] + 64 * line);
  }
}

static int step(sf_node *node) {
  shuffle *s = sf_node_priv(node);
  if (s->draining) {
    if (s->count > 0) {
      emit_one(node, s);
      return 0;
    }
    s->draining = false;
    s->seeded = false;
    s->since_initial = 0;
    if (s->pending_end.kind == SF_ITEM_NONE) return SF_EOF;
    sf_node_push(node, &s->pending_end);
    return 0;
  }
  sf_item item;
  int r = sf_node_pop(node, &item);
  if (r == SF_EOF) {
    s->draining = true;
    s->pending_end.kind = SF_ITEM_NONE;
    return 0;
  }
  if (r < 0) return r;
  if (item.kind == SF_ITEM_EPOCH_END) {
    s->draining = true;
    s->pending_end = item;
    return 0;
  }
  if (!s->seeded) reseed(node, s, item.epoch);
  s->buffer[s->count++] = item.u.sample;
  /* Past the initial fill the buffer still grows to buffer_size: two in, one out (WebDataset's rule). */
  if (s->count >= s->buffer_size || (s->count >= s->initial && (++s->since_initial & 1))) emit_one(node, s);
  return 0;
}

static void uninit(sf_node *node) {
  shuffle *s = sf_node_priv(node);
  for (int64_t i = 0; i < s->count; i++) sf_sample_destroy(&s->buffer[i]);
  free(s->buffer);
  sf_item_clear(&s->pending_end);
}

const sf_stage_def sf_stage_shuffle = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "shuffle",
    .summary = "shuffles samples in a bounded, seeded buffer (initial fill, then one out per one in)",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(shuffle),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
};
