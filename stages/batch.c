/* batch: collates samples into contiguous [B, ...] tensors, writing each sample into its slot as it arrives. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/codec.h"
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

/* What every batch of a bucket holds: its fields in order, how each is collated and one row of each. */
typedef struct layout_field {
  char name[SF_FIELD_NAME_MAX];
  uint8_t collate;
  double pad;     /* PAD: the value after a sample's end */
  sf_tensor row;  /* a header without a buffer: the dtype, and for FIXED a row's shape */
} layout_field;

typedef struct layout {
  int n;
  layout_field f[SF_MAX_FIELDS];
} layout;

/*
 * Samples of different shapes that wait, in a bucket whose shape is not agreed yet, for one that agrees
 * with one of them: a few, as only the very first samples of an epoch (per bucket) wait.
 */
enum { WAIT_MAX = 4 };

/*
 * One bucket: the batch being filled, and the shape its batches take. The shape comes from the stream,
 * not from whichever sample happens to open a batch: in each epoch it is agreed by the first two samples
 * with the same fields and shapes, and every later batch of the epoch keeps it, so an odd sample is the one
 * skipped, wherever it falls. Per epoch, because a resumed run replays its epoch from the start.
 */
typedef struct filling {
  sf_batch *out;                      /* NULL while empty */
  int64_t count;                      /* samples added */
  layout shape;                       /* out's fields; once agreed, every batch's of agreed_epoch */
  bool agreed;
  uint64_t agreed_epoch;
  sf_sample *wait[WAIT_MAX];          /* owned: before agreement, samples of distinct shapes in arrival order */
  int waiting;
  sf_tensor *parts[SF_MAX_FIELDS];    /* PAD/RAGGED: batch_size per-sample references, joined at flush */
  row_run *run[SF_MAX_FIELDS];        /* FIXED: rows not copied yet (the field's tensor has no buffer then) */
} filling;

#define MAX_BUCKETS 9 /* bucket_bounds holds at most 8 numbers */

typedef struct batch {
  int64_t batch_size;   /* option */
  bool partial;         /* option */
  sf_name_list ragged;  /* option: field names */
  sf_name_list pad;     /* option: NAME=VALUE items */
  char *bucket_field;   /* option */
  int bucket_key;       /* option: index into bucket_key_names */
  sf_float_list bucket_bounds; /* option */
  int64_t bucket_hold;  /* option; 0 = never forces a short batch */
  filling fill[MAX_BUCKETS];
  int n_buckets;        /* 1 without bucket_field */
  int64_t held;         /* samples waiting in all fillings, in their batches or for their shape */
  uint64_t epoch;       /* epoch of the samples taken last (those held are of it) */
  uint64_t index;       /* next batch index within that epoch */
  sf_item held_item;    /* item to handle next step (an epoch end, or a sample of a new epoch) */
  bool eof;
  sf_pool *pool;        /* batch buffers, reused: fresh pages cost a fault each */
  bool pin_memory;      /* option */
  const sf_sample *popped; /* the sample popped last, while it is being put (its lent row: sf_node_row_placed) */
} batch;

static const char *const bucket_key_names[] = {"length", "aspect", NULL};

static const sf_option options[] = {
    {"batch_size", SF_OPT_COUNT, offsetof(batch, batch_size), "128", 1, 1e7,
     "samples per batch; every batch of an epoch (of a bucket) has the fields and shapes of the epoch's first "
     "two samples that agree, and a sample that differs is skipped (docs/batches.md)",
     NULL},
    {"partial", SF_OPT_BOOL, offsetof(batch, partial), "true", 0, 0,
     "emit the short last batch of an epoch (or of the input; with buckets, of every bucket); false drops it "
     "and counts its samples as skipped",
     NULL},
    {"ragged", SF_OPT_NAME_LIST, offsetof(batch, ragged), "", 0, 0,
     "comma-separated fields of any length collated as NAME (every sample's values concatenated, 1-D) plus "
     "NAME.offsets (int64 [B+1]; sample i is values[offsets[i]:offsets[i+1]]): encoded members (bytes: txt, "
     "json...) or 1-D decoded fields (e.g. ragged: txt,json,ids). Text fields (last extension txt, text, "
     "transcript, json or jsn, still bytes) are ragged without being listed, unless pad names them",
     NULL},
    {"pad", SF_OPT_NAME_LIST, offsetof(batch, pad), "", 0, 0,
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
     "as a short batch. 0 = buckets x max(batch_size - 1, 4) + 1, which never forces a short batch",
     NULL},
    {"pin_memory", SF_OPT_BOOL, offsetof(batch, pin_memory), "false", 0, 0,
     "allocate batches in page-locked memory (cudaHostRegister through a run-time load of the CUDA "
     "runtime) so host-to-GPU copies can run asynchronously; fails at start without a usable GPU",
     NULL},
    {NULL},
};

/* Finds name among a list's NAME or NAME=VALUE items (blanks before '=' ignored); stores VALUE's text start in *value. */
static bool listed(const sf_name_list *list, const char *name, const char **value) {
  size_t n = strlen(name);
  for (int i = 0; i < list->n; i++) {
    const char *p = list->v[i];
    size_t len = strcspn(p, "= ");
    if (len == n && memcmp(p, name, n) == 0) {
      len += strspn(p + len, " ");
      if (value) *value = p[len] == '=' ? p + len + 1 : NULL;
      return true;
    }
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

/*
 * Whether field f is text that batches as a list when the options do not name it, as WebDataset's default
 * collation makes lists of its decoder's strings and objects: NAME's last extension (after its last '.') one
 * of WebDataset's text and JSON extensions, and the field still the member's bytes (encoded, or checked
 * by decode: 1-D uint8). A text field some stage turned into something else (token ids) is not.
 */
static bool text_field(const sf_field *f) {
  static const char *const text_exts[] = {"txt", "text", "transcript", "json", "jsn"};
  const char *dot = strrchr(f->name, '.'), *ext = dot ? dot + 1 : f->name;
  if (!f->tensor.buffer && !f->recipe) return false;
  if (!f->encoded && (f->tensor.dtype != SF_DTYPE_UINT8 || f->tensor.ndim != 1)) return false;
  for (size_t i = 0; i < sizeof text_exts / sizeof text_exts[0]; i++)
    if (strcmp(ext, text_exts[i]) == 0) return true;
  return false;
}

/* The layout a batch of sample s would have: its decoded fields, the pad/ragged ones and text fields (ragged). */
static int layout_of(const batch *b, const sf_sample *s, layout *lay, char *why, size_t why_size) {
  lay->n = 0;
  int slots = 0; /* fields plus the NAME.offsets / NAME.length made at flush */
  for (int i = 0; i < s->n_fields; i++) {
    const sf_field *f = &s->fields[i];
    const char *value = NULL;
    bool in_ragged = listed(&b->ragged, f->name, NULL), in_pad = !in_ragged && listed(&b->pad, f->name, &value);
    bool named = in_ragged || in_pad;
    int mode = in_ragged ? RAGGED : in_pad ? PAD : text_field(f) ? RAGGED : FIXED;
    if (mode == FIXED && (f->encoded || (!f->tensor.buffer && !f->recipe))) continue;
    slots += mode == FIXED ? 1 : 2;
    if (mode != FIXED && (strlen(f->name) + sizeof ".offsets" > SF_FIELD_NAME_MAX || slots > SF_MAX_FIELDS)) {
      snprintf(why, why_size, "field '%s' %s: a batch holds at most %d fields with names of up to %d characters, "
               "NAME.%s included", f->name, !named ? "(text, a list by default)" : mode == PAD ? "of batch option pad"
               : "of batch option ragged", SF_MAX_FIELDS, SF_FIELD_NAME_MAX - 1, mode == PAD ? "length" : "offsets");
      return SF_ESHAPE;
    }
    if (mode == FIXED && (f->tensor.ndim >= SF_TENSOR_MAX_DIMS || slots > SF_MAX_FIELDS)) {
      snprintf(why, why_size, "field '%s' has %d dimensions; a batch adds one and allows at most %d", f->name,
               f->tensor.ndim, SF_TENSOR_MAX_DIMS);
      return SF_ESHAPE;
    }
    layout_field *g = &lay->f[lay->n++];
    memcpy(g->name, f->name, sizeof g->name);
    g->collate = (uint8_t)mode;
    g->pad = value ? strtod(value, NULL) : 0;
    g->row = (sf_tensor){.dtype = f->tensor.dtype, .ndim = mode == FIXED ? f->tensor.ndim : 0};
    memcpy(g->row.shape, f->tensor.shape, (size_t)g->row.ndim * sizeof g->row.shape[0]);
  }
  return 0;
}

/* Whether two samples agree: the same batch fields, collated alike, of the same dtypes and (fixed) shapes. */
static bool same_layouts(const layout *a, const layout *b) {
  if (a->n != b->n) return false;
  for (int i = 0; i < a->n; i++)
    if (strcmp(a->f[i].name, b->f[i].name) != 0 || a->f[i].collate != b->f[i].collate ||
        !same_layout(&a->f[i].row, &b->f[i].row))
      return false;
  return true;
}

/* Starts filling fl shaped as fl->shape: each fixed field [batch_size, ...], and the pad/ragged ones. */
static int open_batch(batch *b, filling *fl) {
  sf_batch *out = sf_batch_new(b->batch_size);
  if (!out) return SF_ENOMEM;
  fl->out = out;
  fl->count = 0;
  for (int i = 0; i < fl->shape.n; i++) {
    const sf_tensor *row = &fl->shape.f[i].row;
    sf_field *g = &out->fields[i];
    memcpy(g->name, fl->shape.f[i].name, sizeof g->name);
    g->encoded = false;
    if (fl->shape.f[i].collate != FIXED) {
      g->tensor.dtype = row->dtype; /* no buffer until flush: the header keeps the dtype */
      if (!(fl->parts[i] = calloc((size_t)b->batch_size, sizeof(sf_tensor)))) return SF_ENOMEM;
      out->n_fields++;
      continue;
    }
    int64_t shape[SF_TENSOR_MAX_DIMS];
    shape[0] = b->batch_size;
    memcpy(shape + 1, row->shape, (size_t)row->ndim * sizeof shape[0]);
    /* The buffer comes with the first row that needs it (see row_run); pinned batches with buckets (which
       lend no rows) have it at once. */
    int r = b->pin_memory && b->n_buckets > 1 ? sf_pool_tensor(b->pool, &g->tensor, row->dtype, row->ndim + 1, shape)
                          : sf_tensor_set_shape(&g->tensor, row->dtype, row->ndim + 1, shape);
    if (r < 0) return r;
    out->n_fields++;
  }
  out->epoch = b->epoch;
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
 * the rows so far (all of them in the run) and is a plain view; for pinned batches, of the pool's (pinned)
 * memory: a row written where this stage lent it. Returns false when it must be copied.
 */
static bool extend_run(const batch *b, filling *fl, int i, const sf_field *f, size_t slot) {
  if (f->recipe || !f->tensor.buffer || !sf_tensor_is_contiguous(&f->tensor)) return false;
  if (b->pin_memory && !sf_pool_owns(b->pool, f->tensor.buffer)) return false;
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

/*
 * Checks sample s against layout lay (the fields of its batch; `where` says whose they are in the
 * message) before anything is copied. Fields the layout lacks are left out, as in any batch.
 */
static int check_sample(const layout *lay, const sf_sample *s, const char *where, char *why, size_t why_size) {
  for (int i = 0; i < lay->n; i++) {
    const char *name = lay->f[i].name;
    int collate = lay->f[i].collate;
    const sf_field *f = sf_sample_field((sf_sample *)s, name);
    char want[96], got[96];
    if (collate != FIXED) {
      sf_dtype first = lay->f[i].row.dtype;
      bool bad = !f || f->tensor.ndim != 1 || (collate == PAD && f->encoded) || (!f->tensor.buffer && !f->recipe) ||
                 f->tensor.dtype != first;
      if (bad) {
        bool dtype = f && f->tensor.dtype != first;
        const char *is = !f                               ? "missing"
                         : f->encoded && collate == PAD ? "still encoded"
                                                        : describe(&f->tensor, got, sizeof got);
        snprintf(why, why_size, "field '%s' is %s in this sample; batch option %s takes a 1-D%s field%s%s%s%s", name,
                 is, collate == PAD ? "pad" : "ragged", collate == PAD ? " decoded" : " (or encoded)",
                 dtype ? " of dtype " : "", dtype ? sf_dtype_name(first) : "", dtype ? " as in " : "",
                 dtype ? where : "");
        return SF_ESHAPE;
      }
      continue;
    }
    const sf_tensor *slot = &lay->f[i].row;
    if (!f || f->encoded || (!f->tensor.buffer && !f->recipe)) {
      snprintf(why, why_size, "field '%s' is %s in this sample but %s in %s; give every sample the same decoded "
               "fields", name, !f ? "missing" : f->encoded ? "still encoded" : "empty",
               describe(slot, want, sizeof want), where);
      return SF_ESHAPE;
    }
    if (!same_layout(&f->tensor, slot)) {
      snprintf(why, why_size, "field '%s' is %s in this sample but %s in %s; resize or crop to one size (augment) "
               "before batching%s", name, describe(&f->tensor, got, sizeof got), describe(slot, want, sizeof want),
               where, slot->ndim == 1 ? ", or list the field in batch's pad or ragged option" : "");
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
  case SF_DTYPE_FLOAT64: memcpy(p, &v, 8); break;
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
  bool ragged = fl->shape.f[i].collate == RAGGED;
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
    for (int64_t k = parts[j].shape[0]; k < longest; k++) store(dtype, row + (size_t)k * item, fl->shape.f[i].pad);
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
    if (fl->shape.f[i].collate != FIXED) {
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
        if (r == 0) sf_node_counter_add(node, "rows_in_place", (uint64_t)count);
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

/* Reports sample *ps as skipped for `why` and frees it. Returns 0, or the error the policy says stops the run. */
static int skip(sf_node *node, sf_sample **ps, const char *why) {
  sf_sample *s = *ps;
  int r = sf_node_error(node, SF_ESHAPE, sf_sample_url(s), s->key, s->offset, "%s", why);
  sf_sample_destroy(ps);
  if (r < 0) return r;
  sf_node_count_skipped(node, 1);
  return 0;
}

/*
 * Writes sample *ps, which fits fl->shape, as the next row of fl's batch (opening one if needed), frees
 * it, and hands on a full batch. b->held counted the sample when it came.
 */
static int put(sf_node *node, batch *b, filling *fl, sf_sample **ps) {
  sf_sample *s = *ps;
  int r = 0;
  if (!fl->out && (r = open_batch(b, fl)) < 0) {
    close_filling(b, fl);
    sf_sample_destroy(ps);
    return r;
  }
  sf_batch *out = fl->out;
  /* Without buckets this batch's index is known now: a replayed one is not built. */
  bool unbuilt = b->n_buckets == 1 && replayed(node, out->epoch, b->index);
  for (int i = 0; i < out->n_fields && !unbuilt; i++) {
    sf_field *f = sf_sample_field(s, out->fields[i].name);
    if (fl->shape.f[i].collate != FIXED) {
      if ((r = sf_field_materialize(f)) < 0) break;
      sf_tensor_ref(&fl->parts[i][fl->count], &f->tensor);
      continue;
    }
    sf_tensor *t = &out->fields[i].tensor;
    size_t slot = row_bytes(b, t);
    if (!t->buffer && extend_run(b, fl, i, f, slot)) continue;
    if (!t->buffer && (r = fill_slots(b, fl, i)) < 0) break;
    uint8_t *dst = (uint8_t *)sf_tensor_data(t) + slot * (size_t)fl->count;
    sf_field_write(f, dst); /* a deferred one (augment's output) computed straight into the slot */
  }
  if (s == b->popped) { /* the sample just popped: its lent row is where this row is, or the rows realign */
    sf_node_row_placed(node, fl->count);
    b->popped = NULL;
  }
  out->keys[fl->count] = sf_sample_take_key(s);
  out->origins[2 * fl->count] = s->shard_index;
  out->origins[2 * fl->count + 1] = s->index;
  fl->count++;
  sf_sample_destroy(ps);
  if (r < 0) return r;
  return fl->count == b->batch_size ? flush(node, b, fl, false) : 0;
}

/*
 * Sample *ps has the shape of a waiting sample: that shape is agreed for the epoch. The waiting samples
 * that fit it join the batch in the order they came, then *ps; the others are skipped.
 */
static int adopt(sf_node *node, batch *b, filling *fl, const layout *shape, sf_sample **ps) {
  fl->shape = *shape;
  fl->agreed = true;
  fl->agreed_epoch = (*ps)->epoch;
  char why[400];
  int r = 0;
  for (int j = 0; j < fl->waiting; j++) {
    sf_sample *w = fl->wait[j];
    fl->wait[j] = NULL;
    if (r < 0) { /* the run stops */
      sf_sample_destroy(&w);
    } else if (check_sample(&fl->shape, w, "the samples around it", why, sizeof why) < 0) {
      b->held--;
      r = skip(node, &w, why);
    } else {
      r = put(node, b, fl, &w);
    }
  }
  fl->waiting = 0;
  if (r < 0) {
    sf_sample_destroy(ps);
    return r;
  }
  b->held++;
  return put(node, b, fl, ps);
}

/*
 * Before a bucket's shape is agreed in an epoch, sample *ps either agrees with a waiting sample (the
 * shape is adopted) or waits too; when WAIT_MAX samples of different shapes wait already, the oldest
 * is skipped to make room.
 */
static int wait_or_adopt(sf_node *node, batch *b, filling *fl, const layout *mine, sf_sample **ps) {
  char why[512], detail[300];
  for (int j = 0; j < fl->waiting; j++) {
    layout theirs;
    if (layout_of(b, fl->wait[j], &theirs, why, sizeof why) == 0 && same_layouts(&theirs, mine))
      return adopt(node, b, fl, mine, ps);
  }
  if (fl->waiting == WAIT_MAX) {
    sf_sample *oldest = fl->wait[0];
    layout next;
    if (layout_of(b, fl->wait[1], &next, detail, sizeof detail) < 0 ||
        check_sample(&next, oldest, "the next sample", detail, sizeof detail) == 0)
      snprintf(detail, sizeof detail, "its fields differ from the next sample's");
    snprintf(why, sizeof why, "no two of %d samples in a row of epoch %llu have the same shape, so no batch "
             "shape is agreed and the oldest goes: %s", WAIT_MAX + 1, (unsigned long long)(*ps)->epoch, detail);
    memmove(fl->wait, fl->wait + 1, (WAIT_MAX - 1) * sizeof fl->wait[0]);
    fl->waiting--;
    b->held--;
    int r = skip(node, &oldest, why);
    if (r < 0) {
      sf_sample_destroy(ps);
      return r;
    }
  }
  fl->wait[fl->waiting++] = *ps;
  *ps = NULL;
  b->held++;
  return 0;
}

/*
 * A bucket whose waiting samples never agreed must still go (at an epoch's end, or for the hold bound):
 * the oldest one's shape makes a batch with the waiting samples that fit it; the others wait on, and
 * at an epoch's end make batches of their own. The shape is not agreed by this.
 */
static int settle(sf_node *node, batch *b, filling *fl) {
  char why[400];
  int r = layout_of(b, fl->wait[0], &fl->shape, why, sizeof why); /* it passed when the sample came */
  sf_sample *join[WAIT_MAX];
  int n = 0, kept = 0;
  for (int j = 0; j < fl->waiting; j++) {
    sf_sample *w = fl->wait[j];
    if (r == 0 && (j == 0 || check_sample(&fl->shape, w, "", why, sizeof why) == 0))
      join[n++] = w;
    else
      fl->wait[kept++] = w;
  }
  for (int j = kept; j < fl->waiting; j++) fl->wait[j] = NULL;
  fl->waiting = kept;
  for (int j = 0; j < n; j++) {
    if (r < 0) /* the run stops */
      sf_sample_destroy(&join[j]);
    else
      r = put(node, b, fl, &join[j]);
  }
  return r;
}

/* Hands on fl's batch (see flush), or makes one of its waiting samples first. */
static int flush_bucket(sf_node *node, batch *b, filling *fl, bool forced) {
  int r = !fl->out && fl->waiting ? settle(node, b, fl) : 0;
  return r < 0 ? r : flush(node, b, fl, forced);
}

/* Flushes the first non-empty filling; false when all are empty. */
static bool flush_one(sf_node *node, batch *b, int *r) {
  for (int k = 0; k < b->n_buckets; k++)
    if (b->fill[k].out || b->fill[k].waiting) {
      *r = flush_bucket(node, b, &b->fill[k], false);
      return true;
    }
  return false;
}

/*
 * Takes sample *ps into its bucket: checked against the shape agreed for the epoch and copied into
 * the batch, or waiting until two samples agree; frees it (or keeps it waiting).
 */
static int add_sample(sf_node *node, batch *b, sf_sample **ps) {
  sf_sample *s = *ps;
  char why[400] = "";
  int r, k = bucket_of(b, s, why, sizeof why);
  if (k < 0) return skip(node, ps, why);
  filling *fl = &b->fill[k];
  if (s->epoch != b->epoch) { /* the previous epoch's samples are all out (step): batches count from 0 */
    b->epoch = s->epoch;
    b->index = 0;
  }
  if (fl->agreed && fl->agreed_epoch != s->epoch) fl->agreed = false;
  if (fl->agreed) {
    if (check_sample(&fl->shape, s, "this epoch's batches", why, sizeof why) < 0) return skip(node, ps, why);
    b->held++;
    r = put(node, b, fl, ps);
  } else {
    layout mine;
    if (layout_of(b, s, &mine, why, sizeof why) < 0) return skip(node, ps, why);
    if (b->batch_size == 1) { /* a batch of one sample: nothing to agree on */
      fl->shape = mine;
      b->held++;
      r = put(node, b, fl, ps);
    } else {
      r = wait_or_adopt(node, b, fl, &mine, ps);
    }
  }
  if (r < 0) return r;
  if (b->held >= b->bucket_hold) { /* the bound: the fullest bucket goes, short */
    filling *fullest = &b->fill[0];
    for (int j = 1; j < b->n_buckets; j++)
      if (b->fill[j].count + b->fill[j].waiting > fullest->count + fullest->waiting) fullest = &b->fill[j];
    return flush_bucket(node, b, fullest, true);
  }
  return 0;
}

/*
 * One push per step at most (more only when samples that waited for their
 * shape fill a small batch more than once): an epoch end or a sample of a new
 * epoch that needs flushes first waits in `held_item`, and every step flushes
 * one bucket.
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
                      "cannot resume after the first %llu batches of epoch %llu: the epoch has %llu batches; "
                      "resume at a step of 0..%llu",
                      (unsigned long long)step, (unsigned long long)item.epoch, (unsigned long long)made,
                      (unsigned long long)made);
        return SF_EOPTION; /* whatever the error policy: the run would silently skip an epoch */
      }
    }
    sf_node_push(node, &item);
    return 0;
  case SF_ITEM_SAMPLE:
    b->popped = item.u.sample;
    r = add_sample(node, b, &item.u.sample);
    b->popped = NULL;
    return r;
  default: /* nothing else belongs on a sample edge */
    sf_item_clear(&item);
    return 0;
  }
}

/* Checks the pad, ragged and bucket options (their syntax is the stage's own). */
static int check_options(sf_node *node, batch *b) {
  for (int i = 0; i < b->pad.n; i++) {
    const char *p = b->pad.v[i], *eq = strchr(p, '=');
    char *end = NULL;
    if (eq) strtod(eq + 1, &end);
    if (!eq || eq == p || *end)
      return sf_node_option_error(node, "pad", "'%s' is not NAME=VALUE; write e.g. pad: ids=0,audio=0.0", p);
  }
  if (b->bucket_bounds.n > MAX_BUCKETS - 1)
    return sf_node_option_error(node, "bucket_bounds", "%d boundaries: give at most %d", b->bucket_bounds.n,
                                MAX_BUCKETS - 1);
  b->n_buckets = b->bucket_field && *b->bucket_field ? b->bucket_bounds.n + 1 : 1;
  for (int i = 1; i < b->bucket_bounds.n; i++)
    if (!(b->bucket_bounds.v[i] > b->bucket_bounds.v[i - 1]))
      return sf_node_option_error(node, "bucket_bounds", "%g follows %g; give the boundaries in ascending order",
                                  b->bucket_bounds.v[i], b->bucket_bounds.v[i - 1]);
  /* A bucket holds at most batch_size - 1 samples in its batch, or WAIT_MAX waiting for its shape: a bound
     above all of them together is never reached, so it never forces a short batch. */
  int64_t most = b->batch_size - 1 > WAIT_MAX ? b->batch_size - 1 : WAIT_MAX;
  if (b->bucket_hold == 0) b->bucket_hold = b->n_buckets * most + 1;
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
    r = sf_pool_pin(b->pool, &e);
    if (r < 0) {
      sf_node_error(node, r, NULL, NULL, -1, "%s", e.message);
      return r; /* whatever the error policy: the trainer asked for pinned batches */
    }
  }
  /*
   * Producers write their rows straight into batch-sized slabs where they can (augment's output): a batch
   * whose rows all arrive in place is a view of its slab (pinned when the pool is). Not with buckets: each
   * has rows of its own.
   */
  return b->n_buckets == 1 ? sf_node_lend_rows(node, b->pool, b->batch_size) : 0;
}

static void uninit(sf_node *node) {
  batch *b = sf_node_priv(node);
  for (int k = 0; k < MAX_BUCKETS; k++) {
    close_filling(b, &b->fill[k]);
    for (int j = 0; j < b->fill[k].waiting; j++) sf_sample_destroy(&b->fill[k].wait[j]);
  }
  sf_item_clear(&b->held_item);
  sf_pool_unref(&b->pool);
}

const sf_stage_def sf_stage_batch = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "batch",
    .summary = "collates samples into batches of contiguous [B, ...] tensors plus their keys",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_BATCH}),
    .flags = SF_STAGE_LENDS_ROWS,
    .priv_size = sizeof(batch),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
};
