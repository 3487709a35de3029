/* batch: collates samples into contiguous [B, ...] tensors, writing each sample into its slot as it arrives. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "pin.h"
#include "shardflow/pool.h"
#include "shardflow/stage.h"

typedef struct batch {
  int64_t batch_size;   /* option */
  bool partial;         /* option */
  sf_batch *open;       /* the batch being filled, or NULL */
  int64_t count;        /* samples copied into it */
  uint64_t epoch;       /* epoch of the last batch started */
  uint64_t index;       /* next batch index within that epoch */
  sf_item held;         /* item to handle next step (an epoch end, or a sample of a new epoch) */
  bool eof;
  sf_pool *pool;        /* batch buffers, reused: fresh pages cost a fault each */
  bool pin_memory;      /* option */
} batch;

static const sf_option options[] = {
    {"batch_size", SF_OPT_COUNT, offsetof(batch, batch_size), "128", 1, 1e7,
     "samples per batch", NULL},
    {"partial", SF_OPT_BOOL, offsetof(batch, partial), "true", 0, 0,
     "emit the short last batch of an epoch (or of the input); false drops it and counts its samples "
     "as skipped",
     NULL},
    {"pin_memory", SF_OPT_BOOL, offsetof(batch, pin_memory), "false", 0, 0,
     "allocate batches in page-locked memory (cudaHostRegister through a run-time load of the CUDA "
     "runtime) so host-to-GPU copies can run asynchronously; fails at start without a usable GPU",
     NULL},
    {NULL},
};

/* "[32,32,3] uint8" into buf. */
static const char *describe(const sf_tensor *t, char *buf, size_t size) {
  size_t n = 0;
  buf[0] = '\0';
  for (int i = 0; i < t->ndim && n < size; i++) {
    int w = snprintf(buf + n, size - n, "%s%lld", i ? "," : "[", (long long)t->shape[i]);
    if (w < 0) break;
    n += (size_t)w;
  }
  if (n < size) snprintf(buf + n, size - n, "%s %s", t->ndim ? "]" : "[]", sf_dtype_name(t->dtype));
  return buf;
}

static bool same_layout(const sf_tensor *a, const sf_tensor *b) {
  if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i]) return false;
  return true;
}

/* Starts a batch shaped after sample s: its decoded fields, each [batch_size, ...]. */
static int open_batch(batch *b, const sf_sample *s, char *why, size_t why_size) {
  sf_batch *out = sf_batch_new(b->batch_size);
  if (!out) return SF_ENOMEM;
  for (int i = 0; i < s->n_fields; i++) {
    const sf_field *f = &s->fields[i];
    if (f->encoded || (!f->tensor.buffer && !f->recipe)) continue;
    if (f->tensor.ndim >= SF_TENSOR_MAX_DIMS) {
      snprintf(why, why_size, "field '%s' has %d dimensions; a batch adds one and allows at most %d", f->name,
               f->tensor.ndim, SF_TENSOR_MAX_DIMS);
      sf_batch_destroy(&out);
      return SF_ESHAPE;
    }
    int64_t shape[SF_TENSOR_MAX_DIMS];
    shape[0] = b->batch_size;
    memcpy(shape + 1, f->tensor.shape, (size_t)f->tensor.ndim * sizeof shape[0]);
    sf_field *g = &out->fields[out->n_fields];
    int r = sf_pool_tensor(b->pool, &g->tensor, f->tensor.dtype, f->tensor.ndim + 1, shape);
    if (r < 0) {
      sf_batch_destroy(&out);
      return r;
    }
    memcpy(g->name, f->name, sizeof g->name);
    g->encoded = false;
    out->n_fields++;
  }
  if (s->epoch != b->epoch) b->index = 0; /* batches count from 0 in every epoch */
  out->epoch = b->epoch = s->epoch;
  out->index = b->index;
  b->open = out;
  b->count = 0;
  return 0;
}

/* Checks every batch field against sample s before anything is copied. */
static int check_sample(const batch *b, sf_sample *s, char *why, size_t why_size) {
  for (int i = 0; i < b->open->n_fields; i++) {
    const sf_field *g = &b->open->fields[i];
    const sf_field *f = sf_sample_field(s, g->name);
    char want[96], got[96];
    /* The batch tensor without its leading axis, for the comparison and the message. */
    sf_tensor slot = g->tensor;
    slot.ndim--;
    memmove(slot.shape, slot.shape + 1, (size_t)slot.ndim * sizeof slot.shape[0]);
    if (!f || f->encoded || (!f->tensor.buffer && !f->recipe)) {
      snprintf(why, why_size, "field '%s' is %s in this sample but %s in the batch's first sample; give every "
               "sample the same decoded fields", g->name, !f ? "missing" : f->encoded ? "still encoded" : "empty",
               describe(&slot, want, sizeof want));
      return SF_ESHAPE;
    }
    if (!same_layout(&f->tensor, &slot)) {
      snprintf(why, why_size, "field '%s' is %s in this sample but %s in the batch's first sample; resize or "
               "crop to one size (augment) before batching", g->name, describe(&f->tensor, got, sizeof got),
               describe(&slot, want, sizeof want));
      return SF_ESHAPE;
    }
  }
  return 0;
}

/* Hands the open batch on (trimmed to count samples), or drops it when partial is off. */
/* A batch the trainer consumed before a resumption: its samples pass through, unbuilt. */
static bool replayed(sf_node *node, const sf_batch *out) {
  return out->epoch == sf_node_first_epoch(node) && out->index < sf_node_first_step(node);
}

static void flush(sf_node *node, batch *b) {
  sf_batch *out = b->open;
  b->open = NULL;
  if (!out) return;
  if (b->count < b->batch_size && !b->partial) { /* before the replay: a dropped batch has no index */
    sf_node_count_skipped(node, (uint64_t)b->count);
    sf_batch_destroy(&out);
    return;
  }
  if (replayed(node, out)) {
    b->index++;
    sf_batch_destroy(&out);
    return;
  }
  uint64_t bytes = 0;
  out->size = b->count;
  for (int i = 0; i < out->n_fields; i++) {
    sf_tensor *t = &out->fields[i].tensor;
    t->shape[0] = b->count;
    bytes += sf_tensor_nbytes(t);
  }
  b->index++;
  sf_item item = {.kind = SF_ITEM_BATCH, .epoch = out->epoch, .u.batch = out};
  sf_node_push(node, &item);
  sf_node_count_output(node, 1, bytes);
}

/* Copies sample *ps into the open batch (opening one if needed) and frees it. */
static int add_sample(sf_node *node, batch *b, sf_sample **ps) {
  sf_sample *s = *ps;
  char why[400] = "";
  int r = 0;
  bool opened = false;
  if (!b->open) {
    r = open_batch(b, s, why, sizeof why);
    opened = r == 0;
  }
  if (r == 0) r = check_sample(b, s, why, sizeof why);
  if (r == SF_ENOMEM) {
    sf_sample_destroy(ps);
    return r;
  }
  if (r < 0) {
    if (opened) sf_batch_destroy(&b->open);
    r = sf_node_error(node, r, sf_sample_url(s), s->key, s->offset, "%s", why);
    sf_sample_destroy(ps);
    if (r < 0) return r;
    sf_node_count_skipped(node, 1);
    return 0;
  }
  sf_batch *out = b->open;
  for (int i = 0; i < out->n_fields && !replayed(node, out); i++) {
    sf_tensor *t = &out->fields[i].tensor;
    size_t slot = sf_tensor_nbytes(t) / (size_t)b->batch_size;
    uint8_t *dst = (uint8_t *)sf_tensor_data(t) + slot * (size_t)b->count;
    const sf_field *f = sf_sample_field(s, out->fields[i].name);
    if (f->recipe) /* deferred (augment's output): computed straight into the slot, no copy */
      f->recipe->write(f->recipe, dst);
    else
      sf_tensor_copy_to(&f->tensor, dst);
  }
  out->keys[b->count] = sf_sample_take_key(s);
  b->count++;
  sf_sample_destroy(ps);
  if (b->count == b->batch_size) flush(node, b);
  return 0;
}

/*
 * One push per step at most: an epoch end or a sample of a new epoch that
 * needs a flush first waits in `held` for the next step.
 */
static int step(sf_node *node) {
  batch *b = sf_node_priv(node);
  sf_item item;
  if (b->held.kind != SF_ITEM_NONE) {
    item = b->held;
    b->held.kind = SF_ITEM_NONE;
  } else if (b->eof) {
    return SF_EOF;
  } else {
    int r = sf_node_pop(node, &item);
    if (r == SF_EOF) {
      b->eof = true;
      if (!b->open) return SF_EOF;
      flush(node, b);
      return 0;
    }
    if (r < 0) return r;
  }
  switch (item.kind) {
  case SF_ITEM_EPOCH_END:
    if (b->open) {
      flush(node, b);
      b->held = item;
      return 0;
    }
    if (item.epoch == sf_node_first_epoch(node)) { /* a resumption past the end would return nothing */
      uint64_t made = b->epoch == item.epoch ? b->index : 0, step = sf_node_first_step(node);
      if (made < step) {
        sf_node_error(node, SF_EOPTION, NULL, NULL, -1,
                      "cannot resume after the first %llu batches of epoch %llu (--start-step %llu, or the "
                      "state's step): "
                      "the epoch has %llu batches; resume at a step of 0..%llu",
                      (unsigned long long)step, (unsigned long long)item.epoch, (unsigned long long)step,
                      (unsigned long long)made, (unsigned long long)made);
        return SF_EOPTION; /* whatever the error policy: the run would silently skip an epoch */
      }
    }
    sf_node_push(node, &item);
    return 0;
  case SF_ITEM_SAMPLE:
    if (b->open && item.u.sample->epoch != b->epoch) { /* no epoch marker came: cut here */
      flush(node, b);
      b->held = item;
      return 0;
    }
    return add_sample(node, b, &item.u.sample);
  default: /* nothing else belongs on a sample edge */
    sf_item_clear(&item);
    return 0;
  }
}

static int init(sf_node *node) {
  batch *b = sf_node_priv(node);
  b->pool = sf_pool_new(32);
  if (!b->pool) return SF_ENOMEM;
  if (b->pin_memory) {
    sf_error e;
    int r = sf_pin_open(&e);
    if (r < 0) {
      sf_node_error(node, r, NULL, NULL, -1, "%s", e.message);
      return r; /* whatever the error policy: the trainer asked for pinned batches */
    }
    sf_pool_pin(b->pool);
  }
  return 0;
}

static void uninit(sf_node *node) {
  batch *b = sf_node_priv(node);
  sf_batch_destroy(&b->open);
  sf_item_clear(&b->held);
  sf_pool_unref(&b->pool);
}

const sf_stage_def sf_stage_batch = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "batch",
    .summary = "collates samples into batches of contiguous [B, ...] tensors plus their keys",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_BATCH}),
    .priv_size = sizeof(batch),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
};
