/* batch: collates samples into contiguous [B, ...] tensors, writing each sample into its slot as it arrives. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pin.h"
#include "shardflow/pool.h"
#include "shardflow/stage.h"

/* How a batch field is collated (see sf_batch in sample.h). */
enum { FIXED, PAD, RAGGED };

/*
 * Rows of a FIXED field that lie one after another in memory (a local group process writes a unit's
 * results back to back into its shared-memory ring): not copied while they keep doing so. At flush
 * they become the batch tensor itself, a view holding every row's reference (no copy); a row that
 * breaks the run has the rows so far copied into a batch buffer and the run ends.
 */
typedef struct row_run {
  uint8_t *data;     /* row 0's bytes */
  int64_t rows;
  sf_buffer *refs[]; /* one per row: whatever keeps that row's bytes alive */
} row_run;

/* One batch being filled: one per bucket. */
typedef struct filling {
  sf_batch *out;                      /* NULL while empty */
  int64_t count;                      /* samples added */
  uint8_t collate[SF_MAX_FIELDS];     /* per field of out */
  double pad[SF_MAX_FIELDS];          /* pad value of a PAD field */
  sf_tensor *parts[SF_MAX_FIELDS];    /* PAD/RAGGED: batch_size per-sample references, joined at flush */
  row_run *run[SF_MAX_FIELDS];        /* FIXED: rows not copied yet (the field's tensor has no buffer then) */
} filling;

#define MAX_BUCKETS 9 /* bucket_bounds holds at most 8 numbers */

typedef struct batch {
  int64_t batch_size;   /* option */
  bool partial;         /* option */
  char *ragged;         /* option: comma-separated field names */
  char *pad;            /* option: comma-separated NAME=VALUE */
  char *bucket_field;   /* option */
  int bucket_key;       /* option: index into bucket_key_names */
  sf_float_list bucket_bounds; /* option */
  int64_t bucket_hold;  /* option; 0 = never forces a short batch */
  filling fill[MAX_BUCKETS];
  int n_buckets;        /* 1 without bucket_field */
  int64_t held;         /* samples waiting in all fillings */
  uint64_t epoch;       /* epoch of the last batch started */
  uint64_t index;       /* next batch index within that epoch */
  sf_item held_item;    /* item to handle next step (an epoch end, or a sample of a new epoch) */
  bool eof;
  sf_pool *pool;        /* batch buffers, reused: fresh pages cost a fault each */
  bool pin_memory;      /* option */
} batch;

static const char *const bucket_key_names[] = {"length", "aspect", NULL};

static const sf_option options[] = {
    {"batch_size", SF_OPT_COUNT, offsetof(batch, batch_size), "128", 1, 1e7,
     "samples per batch", NULL},
    {"partial", SF_OPT_BOOL, offsetof(batch, partial), "true", 0, 0,
     "emit the short last batch of an epoch (or of the input; with buckets, of every bucket); false drops it "
     "and counts its samples as skipped",
     NULL},
    {"ragged", SF_OPT_STRING, offsetof(batch, ragged), "", 0, 0,
     "comma-separated fields of any length collated as NAME (every sample's values concatenated, 1-D) plus "
     "NAME.offsets (int64 [B+1]; sample i is values[offsets[i]:offsets[i+1]]): encoded members (bytes: txt, "
     "json...) or 1-D decoded fields (e.g. ragged: txt,json,ids)",
     NULL},
    {"pad", SF_OPT_STRING, offsetof(batch, pad), "", 0, 0,
     "comma-separated NAME=VALUE: 1-D decoded fields padded with VALUE to the batch's longest, as NAME [B,L] "
     "plus NAME.length (int32 [B]) (e.g. pad: ids=0,audio=0.0)",
     NULL},
    {"bucket_field", SF_OPT_STRING, offsetof(batch, bucket_field), "", 0, 0,
     "field whose bucket_key sorts samples into buckets; each batch holds samples of one bucket (\"\" = no "
     "buckets)",
     NULL},
    {"bucket_key", SF_OPT_ENUM, offsetof(batch, bucket_key), "length", 0, 0,
     "length: the field's first dimension (bytes of an encoded member, elements of a 1-D field); aspect: "
     "width / height of an [H,W] or [H,W,C] image",
     bucket_key_names},
    {"bucket_bounds", SF_OPT_FLOAT_LIST, offsetof(batch, bucket_bounds), "", 0, 0,
     "ascending bucket boundaries (at most 8): bucket i holds keys in [bounds[i-1], bounds[i])",
     NULL},
    {"bucket_hold", SF_OPT_COUNT, offsetof(batch, bucket_hold), "0", 0, 1e9,
     "most samples waiting in all buckets; when reached, the fullest bucket (the first of equals) is emitted "
     "as a short batch. 0 = buckets x (batch_size - 1) + 1, which never forces a short batch",
     NULL},
    {"pin_memory", SF_OPT_BOOL, offsetof(batch, pin_memory), "false", 0, 0,
     "allocate batches in page-locked memory (cudaHostRegister through a run-time load of the CUDA "
     "runtime) so host-to-GPU copies can run asynchronously; fails at start without a usable GPU",
     NULL},
    {NULL},
};

/* Finds name in a comma-separated list of NAME or NAME=VALUE; stores VALUE's text start in *value. */
static bool listed(const char *list, const char *name, const char **value) {
  size_t n = strlen(name);
  for (const char *p = list; p && *p;) {
    p += strspn(p, " ");
    size_t len = strcspn(p, ",= ");
    if (len == n && memcmp(p, name, n) == 0) {
      len += strspn(p + len, " ");
      if (value) *value = p[len] == '=' ? p + len + 1 : NULL;
      return true;
    }
    p += strcspn(p, ",");
    if (*p == ',') p++;
  }
  return false;
}

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

/* Starts filling fl shaped after sample s: its decoded fields, each [batch_size, ...], and its pad/ragged ones. */
static int open_batch(batch *b, filling *fl, const sf_sample *s, char *why, size_t why_size) {
  sf_batch *out = sf_batch_new(b->batch_size);
  if (!out) return SF_ENOMEM;
  fl->out = out;
  fl->count = 0;
  int slots = 0; /* fields plus the NAME.offsets / NAME.length made at flush */
  for (int i = 0; i < s->n_fields; i++) {
    const sf_field *f = &s->fields[i];
    const char *value = NULL;
    int mode = listed(b->ragged, f->name, NULL) ? RAGGED : listed(b->pad, f->name, &value) ? PAD : FIXED;
    if (mode == FIXED && (f->encoded || (!f->tensor.buffer && !f->recipe))) continue;
    sf_field *g = &out->fields[out->n_fields];
    memcpy(g->name, f->name, sizeof g->name);
    g->encoded = false;
    fl->collate[out->n_fields] = (uint8_t)mode;
    slots += mode == FIXED ? 1 : 2;
    if (mode != FIXED) {
      fl->pad[out->n_fields] = value ? strtod(value, NULL) : 0;
      g->tensor.dtype = f->tensor.dtype; /* no buffer until flush: the header keeps the dtype */
      if (strlen(f->name) + sizeof ".offsets" > SF_FIELD_NAME_MAX || slots > SF_MAX_FIELDS) {
        snprintf(why, why_size, "field '%s' of batch option %s: a batch holds at most %d fields with names of up "
                 "to %d characters, NAME.%s included", f->name, mode == PAD ? "pad" : "ragged", SF_MAX_FIELDS,
                 SF_FIELD_NAME_MAX - 1, mode == PAD ? "length" : "offsets");
        return SF_ESHAPE;
      }
      if (!(fl->parts[out->n_fields] = calloc((size_t)b->batch_size, sizeof(sf_tensor)))) return SF_ENOMEM;
      out->n_fields++;
      continue;
    }
    if (f->tensor.ndim >= SF_TENSOR_MAX_DIMS || slots > SF_MAX_FIELDS) {
      snprintf(why, why_size, "field '%s' has %d dimensions; a batch adds one and allows at most %d", f->name,
               f->tensor.ndim, SF_TENSOR_MAX_DIMS);
      return SF_ESHAPE;
    }
    int64_t shape[SF_TENSOR_MAX_DIMS];
    shape[0] = b->batch_size;
    memcpy(shape + 1, f->tensor.shape, (size_t)f->tensor.ndim * sizeof shape[0]);
    /* The buffer comes with the first row that needs it (see row_run); pinned batches have it at once. */
    int r = b->pin_memory ? sf_pool_tensor(b->pool, &g->tensor, f->tensor.dtype, f->tensor.ndim + 1, shape)
                          : sf_tensor_set_shape(&g->tensor, f->tensor.dtype, f->tensor.ndim + 1, shape);
    if (r < 0) return r;
    out->n_fields++;
  }
  if (s->epoch != b->epoch) b->index = 0; /* batches count from 0 in every epoch */
  out->epoch = b->epoch = s->epoch;
  return 0;
}

/* Bytes of one row of fixed field tensor t ([batch_size, ...]). */
static size_t row_bytes(const batch *b, const sf_tensor *t) { return sf_tensor_nbytes(t) / (size_t)b->batch_size; }

static void drop_run(row_run **run) {
  if (!*run) return;
  for (int64_t j = 0; j < (*run)->rows; j++) sf_buffer_unref(&(*run)->refs[j]);
  free(*run);
  *run = NULL;
}

static void free_run(void *opaque, uint8_t *data) {
  (void)data;
  row_run *run = opaque;
  drop_run(&run);
}

/*
 * Takes sample field f as the next row of fixed field i without copying it, when it lies right after
 * the rows so far (all of them in the run) and is a plain view. Returns false when it must be copied.
 */
static bool extend_run(const batch *b, filling *fl, int i, const sf_field *f, size_t slot) {
  if (f->recipe || !f->tensor.buffer || !sf_tensor_is_contiguous(&f->tensor)) return false;
  row_run *run = fl->run[i];
  uint8_t *data = sf_tensor_data(&f->tensor);
  if (fl->count == 0 && !run) {
    if (!(run = fl->run[i] = calloc(1, sizeof *run + (size_t)b->batch_size * sizeof run->refs[0]))) return false;
    run->data = data;
  } else if (!run || run->rows != fl->count || data != run->data + slot * (size_t)run->rows) {
    return false;
  }
  run->refs[run->rows++] = sf_buffer_ref(f->tensor.buffer);
  return true;
}

/* Gives fixed field i its batch buffer and copies the run's rows into it (one copy: they are adjacent). */
static int fill_slots(batch *b, filling *fl, int i) {
  sf_tensor *t = &fl->out->fields[i].tensor;
  sf_tensor header = *t; /* sf_pool_tensor rewrites *t */
  int r = sf_pool_tensor(b->pool, t, header.dtype, header.ndim, header.shape);
  if (r < 0) {
    *t = header;
    return r;
  }
  row_run *run = fl->run[i];
  if (run) memcpy(sf_tensor_data(t), run->data, row_bytes(b, t) * (size_t)run->rows);
  drop_run(&fl->run[i]);
  return 0;
}

/* Empties fl: drops the batch and the per-sample references it holds. */
static void close_filling(const batch *b, filling *fl) {
  for (int i = 0; i < SF_MAX_FIELDS; i++) {
    drop_run(&fl->run[i]);
    for (int64_t j = 0; fl->parts[i] && j < b->batch_size; j++) sf_tensor_clear(&fl->parts[i][j]);
    free(fl->parts[i]);
    fl->parts[i] = NULL;
  }
  sf_batch_destroy(&fl->out);
  fl->count = 0;
}

/* Checks every batch field of fl against sample s before anything is copied. */
static int check_sample(const filling *fl, sf_sample *s, char *why, size_t why_size) {
  for (int i = 0; i < fl->out->n_fields; i++) {
    const sf_field *g = &fl->out->fields[i];
    const sf_field *f = sf_sample_field(s, g->name);
    char want[96], got[96];
    if (fl->collate[i] != FIXED) {
      sf_dtype first = g->tensor.dtype;
      bool bad = !f || f->tensor.ndim != 1 || (fl->collate[i] == PAD && f->encoded) ||
                 (!f->tensor.buffer && !f->recipe) || f->tensor.dtype != first;
      if (bad) {
        snprintf(why, why_size, "field '%s' is %s in this sample; batch option %s takes a 1-D%s field%s%s", g->name,
                 !f ? "missing" : f->encoded && fl->collate[i] == PAD ? "still encoded" : describe(&f->tensor, got, sizeof got),
                 fl->collate[i] == PAD ? "pad" : "ragged", fl->collate[i] == PAD ? " decoded" : " (or encoded)",
                 f && f->tensor.dtype != first ? " of the batch's first sample's dtype, " : "",
                 f && f->tensor.dtype != first ? sf_dtype_name(first) : "");
        return SF_ESHAPE;
      }
      continue;
    }
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
               "crop to one size (augment) before batching%s", g->name, describe(&f->tensor, got, sizeof got),
               describe(&slot, want, sizeof want),
               slot.ndim == 1 ? ", or list the field in batch's pad or ragged option" : "");
      return SF_ESHAPE;
    }
  }
  return 0;
}

/* Stores v at p as dtype (a pad value). */
static void store(sf_dtype dtype, void *p, double v) {
  switch (dtype) {
  case SF_DTYPE_UINT8: *(uint8_t *)p = (uint8_t)v; break;
  case SF_DTYPE_INT32: *(int32_t *)p = (int32_t)v; break;
  case SF_DTYPE_INT64: *(int64_t *)p = (int64_t)v; break;
  case SF_DTYPE_FLOAT32: memcpy(p, &(float){(float)v}, 4); break;
  default: { /* bfloat16: the float's top half */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    *(uint16_t *)p = (uint16_t)(u >> 16);
  }
  }
}

/*
 * Joins field i's per-sample tensors into out's field i and appends its
 * companion: NAME.offsets int64 [B+1] (ragged) or NAME.length int32 [B] (pad).
 */
static int join_field(batch *b, filling *fl, int i) {
  sf_batch *out = fl->out;
  const sf_tensor *parts = fl->parts[i];
  sf_dtype dtype = out->fields[i].tensor.dtype;
  size_t item = sf_dtype_size(dtype);
  int64_t n = fl->count, total = 0, longest = 0;
  for (int64_t j = 0; j < n; j++) {
    total += parts[j].shape[0];
    if (parts[j].shape[0] > longest) longest = parts[j].shape[0];
  }
  sf_field *extra = &out->fields[out->n_fields];
  bool ragged = fl->collate[i] == RAGGED;
  char name[SF_FIELD_NAME_MAX]; /* a copy: the compiler cannot tell the two fields apart */
  memcpy(name, out->fields[i].name, sizeof name);
  snprintf(extra->name, sizeof extra->name, "%.23s.%s", name, ragged ? "offsets" : "length");
  int64_t shape[2] = {ragged ? total : n, longest}, extra_shape = ragged ? n + 1 : n;
  int r = sf_pool_tensor(b->pool, &out->fields[i].tensor, dtype, ragged ? 1 : 2, shape);
  if (r == 0)
    r = sf_pool_tensor(b->pool, &extra->tensor, ragged ? SF_DTYPE_INT64 : SF_DTYPE_INT32, 1, &extra_shape);
  if (r < 0) return r;
  out->n_fields++;
  uint8_t *dst = sf_tensor_data(&out->fields[i].tensor);
  if (ragged) {
    int64_t *offsets = sf_tensor_data(&extra->tensor);
    offsets[0] = 0;
    for (int64_t j = 0; j < n; j++) {
      sf_tensor_copy_to(&parts[j], dst + (size_t)offsets[j] * item);
      offsets[j + 1] = offsets[j] + parts[j].shape[0];
    }
    return 0;
  }
  int32_t *length = sf_tensor_data(&extra->tensor);
  for (int64_t j = 0; j < n; j++) {
    uint8_t *row = dst + (size_t)(j * longest) * item;
    sf_tensor_copy_to(&parts[j], row);
    for (int64_t k = parts[j].shape[0]; k < longest; k++) store(dtype, row + (size_t)k * item, fl->pad[i]);
    length[j] = (int32_t)parts[j].shape[0];
  }
  return 0;
}

/* A batch the trainer consumed before a resumption: its samples pass through, unbuilt. */
static bool replayed(sf_node *node, uint64_t epoch, uint64_t index) {
  return epoch == sf_node_first_epoch(node) && index < sf_node_first_step(node);
}

/*
 * Hands fl's batch on (trimmed to its count), or drops it when it is an
 * epoch's short last one and partial is off (forced: the hold bound made it
 * short, so it is emitted whatever partial says).  Returns 0, or an error the
 * policy says stops the run.
 */
static int flush(sf_node *node, batch *b, filling *fl, bool forced) {
  sf_batch *out = fl->out;
  if (!out) return 0;
  int64_t count = fl->count;
  b->held -= count;
  if (count < b->batch_size && !b->partial && !forced) { /* before the replay: a dropped batch has no index */
    sf_node_count_skipped(node, (uint64_t)count);
    close_filling(b, fl);
    return 0;
  }
  out->index = b->index++;
  if (replayed(node, out->epoch, out->index)) {
    close_filling(b, fl);
    return 0;
  }
  uint64_t bytes = 0;
  out->size = count;
  int r = 0, n = out->n_fields;
  for (int i = 0; i < n && r == 0; i++) {
    if (fl->collate[i] != FIXED) {
      r = join_field(b, fl, i);
      continue;
    }
    sf_tensor *t = &out->fields[i].tensor;
    if (!t->buffer && fl->run[i] && fl->run[i]->rows == count) {
      /* Every row was adjacent: the batch tensor is a view of them, holding their references. */
      row_run *run = fl->run[i];
      sf_buffer *joined = sf_buffer_wrap(run->data, row_bytes(b, t) * (size_t)count, free_run, run);
      if (joined) {
        fl->run[i] = NULL;
        int64_t shape[SF_TENSOR_MAX_DIMS];
        memcpy(shape, t->shape, (size_t)t->ndim * sizeof shape[0]);
        shape[0] = count;
        r = sf_tensor_view(t, t->dtype, t->ndim, shape, joined, 0);
        continue;
      }
    }
    if (!t->buffer) r = fill_slots(b, fl, i);
    t->shape[0] = count;
  }
  for (int i = 0; i < out->n_fields; i++) bytes += sf_tensor_nbytes(&out->fields[i].tensor);
  fl->out = NULL;
  close_filling(b, fl);
  if (r < 0) {
    sf_batch_destroy(&out);
    return sf_node_error(node, r, NULL, NULL, -1, "cannot allocate batch %llu of epoch %llu",
                         (unsigned long long)b->index - 1, (unsigned long long)b->epoch);
  }
  sf_item item = {.kind = SF_ITEM_BATCH, .epoch = out->epoch, .u.batch = out};
  sf_node_push(node, &item);
  sf_node_count_output(node, 1, bytes);
  return 0;
}

/* Flushes the first non-empty filling; false when all are empty. */
static bool flush_one(sf_node *node, batch *b, int *r) {
  for (int k = 0; k < b->n_buckets; k++)
    if (b->fill[k].out) {
      *r = flush(node, b, &b->fill[k], false);
      return true;
    }
  return false;
}

/* The bucket of sample s (0 without buckets), or -1 with the reason in why. */
static int bucket_of(const batch *b, sf_sample *s, char *why, size_t why_size) {
  if (b->n_buckets == 1) return 0;
  const sf_field *f = sf_sample_field(s, b->bucket_field);
  const sf_tensor *t = f ? &f->tensor : NULL;
  double key;
  if (b->bucket_key == 0 && t && t->ndim >= 1) {
    key = (double)t->shape[0];
  } else if (b->bucket_key == 1 && t && !f->encoded && (t->ndim == 2 || t->ndim == 3) && t->shape[0] > 0) {
    key = (double)t->shape[1] / (double)t->shape[0];
  } else {
    snprintf(why, why_size, "field '%s' (batch option bucket_field) is %s in this sample; bucket_key %s needs %s",
             b->bucket_field, !f ? "missing" : f->encoded ? "still encoded" : "of another shape",
             bucket_key_names[b->bucket_key],
             b->bucket_key ? "a decoded [H,W] or [H,W,C] image" : "a field of at least one dimension");
    return -1;
  }
  int k = 0;
  while (k < b->bucket_bounds.n && key >= b->bucket_bounds.v[k]) k++;
  return k;
}

/* Copies sample *ps into its bucket's batch (opening one if needed) and frees it. */
static int add_sample(sf_node *node, batch *b, sf_sample **ps) {
  sf_sample *s = *ps;
  char why[400] = "";
  int r = 0, k = bucket_of(b, s, why, sizeof why);
  filling *fl = k >= 0 ? &b->fill[k] : NULL;
  bool opened = false;
  if (k < 0) {
    r = SF_ESHAPE;
  } else if (!fl->out) {
    r = open_batch(b, fl, s, why, sizeof why);
    opened = true;
  }
  if (r == 0) r = check_sample(fl, s, why, sizeof why);
  if (r < 0 && opened) close_filling(b, fl);
  if (r == SF_ENOMEM) {
    sf_sample_destroy(ps);
    return r;
  }
  if (r < 0) {
    r = sf_node_error(node, r, sf_sample_url(s), s->key, s->offset, "%s", why);
    sf_sample_destroy(ps);
    if (r < 0) return r;
    sf_node_count_skipped(node, 1);
    return 0;
  }
  sf_batch *out = fl->out;
  /* Without buckets this batch's index is known now: a replayed one is not built. */
  bool skip = b->n_buckets == 1 && replayed(node, out->epoch, b->index);
  for (int i = 0; i < out->n_fields && !skip; i++) {
    sf_field *f = sf_sample_field(s, out->fields[i].name);
    if (fl->collate[i] != FIXED) {
      if ((r = sf_field_materialize(f)) < 0) break;
      sf_tensor_ref(&fl->parts[i][fl->count], &f->tensor);
      continue;
    }
    sf_tensor *t = &out->fields[i].tensor;
    size_t slot = row_bytes(b, t);
    if (!t->buffer && extend_run(b, fl, i, f, slot)) continue;
    if (!t->buffer && (r = fill_slots(b, fl, i)) < 0) break;
    uint8_t *dst = (uint8_t *)sf_tensor_data(t) + slot * (size_t)fl->count;
    if (f->recipe) /* deferred (augment's output): computed straight into the slot, no copy */
      f->recipe->write(f->recipe, dst);
    else
      sf_tensor_copy_to(&f->tensor, dst);
  }
  out->keys[fl->count] = sf_sample_take_key(s);
  out->origins[2 * fl->count] = s->shard_index;
  out->origins[2 * fl->count + 1] = s->index;
  fl->count++;
  b->held++;
  sf_sample_destroy(ps);
  if (r < 0) return r;
  if (fl->count == b->batch_size) return flush(node, b, fl, false);
  if (b->held >= b->bucket_hold) { /* the bound: the fullest bucket goes, short */
    filling *fullest = &b->fill[0];
    for (int j = 1; j < b->n_buckets; j++)
      if (b->fill[j].count > fullest->count) fullest = &b->fill[j];
    return flush(node, b, fullest, true);
  }
  return 0;
}

/*
 * One push per step at most: an epoch end or a sample of a new epoch that
 * needs flushes first waits in `held_item`, and every step flushes one bucket.
 */
static int step(sf_node *node) {
  batch *b = sf_node_priv(node);
  sf_item item;
  int r = 0;
  if (b->held_item.kind != SF_ITEM_NONE) {
    item = b->held_item;
    b->held_item.kind = SF_ITEM_NONE;
  } else if (b->eof) {
    return flush_one(node, b, &r) ? r : SF_EOF;
  } else {
    r = sf_node_pop(node, &item);
    if (r == SF_EOF) {
      b->eof = true;
      return flush_one(node, b, &r) ? r : SF_EOF;
    }
    if (r < 0) return r;
  }
  bool new_epoch = item.kind == SF_ITEM_SAMPLE && b->held > 0 && item.u.sample->epoch != b->epoch;
  if ((item.kind == SF_ITEM_EPOCH_END || new_epoch) && flush_one(node, b, &r)) { /* no epoch marker came: cut */
    b->held_item = item;
    return r;
  }
  switch (item.kind) {
  case SF_ITEM_EPOCH_END:
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
    return add_sample(node, b, &item.u.sample);
  default: /* nothing else belongs on a sample edge */
    sf_item_clear(&item);
    return 0;
  }
}

/* Checks the pad, ragged and bucket options (their syntax is the stage's own). */
static int check_options(sf_node *node, batch *b) {
  for (const char *p = b->pad; p && *p;) {
    size_t len = strcspn(p, ",");
    const char *eq = memchr(p, '=', len);
    char *end = NULL;
    if (eq) strtod(eq + 1, &end);
    if (!eq || eq == p || end != p + len) {
      sf_node_error(node, SF_EOPTION, NULL, NULL, -1,
                    "batch option pad: '%.*s' is not NAME=VALUE; write e.g. pad: ids=0,audio=0.0", (int)len, p);
      return SF_EOPTION;
    }
    p += len + (p[len] == ',');
  }
  b->n_buckets = b->bucket_field && *b->bucket_field ? b->bucket_bounds.n + 1 : 1;
  for (int i = 1; i < b->bucket_bounds.n; i++)
    if (!(b->bucket_bounds.v[i] > b->bucket_bounds.v[i - 1])) {
      sf_node_error(node, SF_EOPTION, NULL, NULL, -1,
                    "batch option bucket_bounds: %g follows %g; give the boundaries in ascending order",
                    b->bucket_bounds.v[i], b->bucket_bounds.v[i - 1]);
      return SF_EOPTION;
    }
  if (b->bucket_hold == 0) b->bucket_hold = b->n_buckets * (b->batch_size - 1) + 1;
  return 0;
}

static int init(sf_node *node) {
  batch *b = sf_node_priv(node);
  int r = check_options(node, b);
  if (r < 0) return r;
  b->pool = sf_pool_new(32);
  if (!b->pool) return SF_ENOMEM;
  if (b->pin_memory) {
    sf_error e;
    r = sf_pin_open(&e);
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
  for (int k = 0; k < MAX_BUCKETS; k++) close_filling(b, &b->fill[k]);
  sf_item_clear(&b->held_item);
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
