/* shuffle: a bounded buffer of samples with an initial fill, seeded per epoch (WebDataset's shuffle). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/codec.h"
#include "shardflow/stage.h"

/* Emissions drawn ahead: a step each to bring in a sample's header, its fields' recipes (the start,
 * then the rest of a lazy field's description), and the bytes they read. */
enum { AHEAD = 4 };

typedef struct shuffle {
  int64_t buffer_size;  /* option */
  int64_t initial;      /* option */
  sf_compact_sample **buffer; /* compact: a buffer of 10,000 full sample structs is 27 MiB to fault in */
  int64_t count;
  uint64_t epoch;       /* epoch whose samples the buffer holds */
  uint64_t since_initial; /* samples added after the initial fill, for the two-in-one-out growth */
  bool seeded;
  bool draining;        /* an epoch end or EOF arrived: empty the buffer first */
  sf_item pending_end;  /* the epoch-end marker to forward once drained */
  sf_rng rng;
  /*
   * The next emissions' indices, drawn early while the buffer is full or drains (see emit_one): ahead[0]
   * is the next one, drawn below bound[0] samples; before[k] is the rng as it was before ahead[k] was drawn.
   */
  int n_ahead;
  uint64_t ahead[AHEAD];
  uint64_t bound[AHEAD];
  sf_rng before[AHEAD];
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
  s->n_ahead = 0;
  sf_rng_seed(&s->rng, sf_seed_mix(sf_node_seed(node), epoch));
  s->epoch = epoch;
  s->seeded = true;
}

static void prefetch_lines(const void *p, size_t size) {
  for (size_t at = 0; at < size; at += 64) __builtin_prefetch((const char *)p + at);
}

/* The fields of a buffered sample (*n of them), or none for NULL. */
static const sf_field *fields_of(const sf_compact_sample *c, int *n) {
  *n = 0;
  return c ? sf_compact_sample_fields(c, n, NULL) : NULL;
}

/*
 * Brings into the cache, one level a step, what the emissions drawn ahead will touch: the sample drawn
 * last its header, the one before its fields' recipes (or buffers), the one before that the rest of
 * their descriptions (the lazy module's kinds), the next one the bytes its deferred fields will read (a
 * full buffer's samples are otherwise cache misses one after another inside the batch's recipe->write()). Hints only: a sample
 * may have moved since its index was drawn, and slot `count` is empty now (its pointer stale, perhaps
 * the sample just handed on), so it is never read.
 */
static void prefetch_ahead(shuffle *s) {
  const uint64_t held = (uint64_t)s->count;
  const sf_compact_sample *at[AHEAD];
  for (int k = 0; k < AHEAD; k++) at[k] = k < s->n_ahead && s->ahead[k] < held ? s->buffer[s->ahead[k]] : NULL;
  if (at[3]) prefetch_lines(at[3], offsetof(sf_sample, fields) + 2 * sizeof(sf_field));
  int n;
  const sf_field *fields = fields_of(at[2], &n);
  for (int f = 0; f < n; f++) {
    if (fields[f].recipe) prefetch_lines(fields[f].recipe, 128);
    else __builtin_prefetch(fields[f].tensor.buffer);
  }
  fields = fields_of(at[1], &n);
  for (int f = 0; f < n; f++) {
    size_t size;
    const void *description = sf_field_recipe_data(&fields[f], &size);
    if (description) prefetch_lines(description, size);
  }
  fields = fields_of(at[0], &n);
  for (int f = 0; f < n; f++) {
    size_t size;
    const void *source = sf_field_source(&fields[f], &size);
    if (source) prefetch_lines(source, size < 8192 ? size : 8192);
  }
}

/*
 * Draws the next emissions' indices now, where the counts they are drawn from are known (the same draws,
 * early), and prefetches what they will touch: a full buffer emits again after one more sample, from
 * buffer_size samples; a draining one from one fewer each time.
 */
static void draw_ahead(shuffle *s) {
  while (s->n_ahead < AHEAD) {
    uint64_t bound = s->draining ? (uint64_t)(s->count - s->n_ahead) : (uint64_t)s->buffer_size;
    if (bound == 0) break;
    s->before[s->n_ahead] = s->rng;
    s->bound[s->n_ahead] = bound;
    s->ahead[s->n_ahead++] = sf_rng_below(&s->rng, bound);
  }
  prefetch_ahead(s);
}

/* Swap a random element to the end and hand it on. Returns 0, or SF_ENOMEM (the run then stops). */
static int emit_one(sf_node *node, shuffle *s) {
  uint64_t i;
  if (s->n_ahead > 0 && s->bound[0] == (uint64_t)s->count) {
    i = s->ahead[0];
    s->n_ahead--;
    memmove(s->ahead, s->ahead + 1, (size_t)s->n_ahead * sizeof *s->ahead);
    memmove(s->bound, s->bound + 1, (size_t)s->n_ahead * sizeof *s->bound);
    memmove(s->before, s->before + 1, (size_t)s->n_ahead * sizeof *s->before);
  } else {
    if (s->n_ahead > 0) s->rng = s->before[0]; /* drawn from another count (a full buffer that now drains) */
    s->n_ahead = 0;
    i = sf_rng_below(&s->rng, (uint64_t)s->count);
  }
  sf_sample *out = sf_compact_sample_expand(&s->buffer[i]);
  if (!out) return SF_ENOMEM;
  s->buffer[i] = s->buffer[--s->count];
  sf_item item = {.kind = SF_ITEM_SAMPLE, .epoch = out->epoch, .u.sample = out};
  sf_node_count_output(node, 1, sf_item_nbytes(&item));
  sf_node_push(node, &item);
  if (s->count == s->buffer_size - 1 || (s->draining && s->count > 0)) draw_ahead(s);
  return 0;
}

static int step(sf_node *node) {
  shuffle *s = sf_node_priv(node);
  if (s->draining) {
    if (s->count > 0) return emit_one(node, s);
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
  sf_compact_sample *compact = sf_sample_compact(&item.u.sample);
  if (!compact) {
    sf_item_clear(&item);
    return SF_ENOMEM;
  }
  s->buffer[s->count++] = compact;
  /* Past the initial fill the buffer still grows to buffer_size: two in, one out (WebDataset's rule). */
  if (s->count >= s->buffer_size || (s->count >= s->initial && (++s->since_initial & 1))) return emit_one(node, s);
  return 0;
}

static void uninit(sf_node *node) {
  shuffle *s = sf_node_priv(node);
  for (int64_t i = 0; i < s->count; i++) sf_compact_sample_destroy(&s->buffer[i]);
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
