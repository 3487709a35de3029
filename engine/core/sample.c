/* Shards, samples, batches and queue items: constructors and destructors. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "huge_map.h"
#include "shardflow/stage.h"

/* What sf_shard_reading hides (shardflow/sample.h): shard_source sets it, tar_split reads it. */
struct sf_shard_reading {
  bool allow_pipe;
  uint64_t *keep;  /* ascending, n_keep of them, malloc'd; NULL = every sample */
  size_t n_keep;
  sf_shard_range range; /* length 0: the whole shard; etag malloc'd or NULL */
};

/* The shard and its reading in one allocation. */
typedef struct shard_block {
  sf_shard shard;
  sf_shard_reading reading;
} shard_block;

sf_shard *sf_shard_new(const char *url) {
  shard_block *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->shard.reading = &b->reading;
  b->shard.url = strdup(url ? url : "");
  if (!b->shard.url) {
    free(b);
    return NULL;
  }
  return &b->shard;
}

void sf_shard_destroy(sf_shard **ps) {
  if (!ps || !*ps) return;
  sf_shard_reading *r = (*ps)->reading;
  if (r) {
    free(r->keep);
    free((char *)r->range.etag);
    free((char *)r->range.index);
  }
  free((*ps)->url);
  free(*ps); /* the block: shard first */
  *ps = NULL;
}

int sf_shard_set_allow_pipe(sf_shard *shard, bool allow) {
  if (!shard || !shard->reading) return SF_EINVAL;
  shard->reading->allow_pipe = allow;
  return 0;
}

bool sf_shard_allow_pipe(const sf_shard *shard) { return shard && shard->reading && shard->reading->allow_pipe; }

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

int sf_shard_set_keep(sf_shard *shard, uint64_t *keep, size_t n) {
  if (!shard || !shard->reading) {
    free(keep);
    return SF_EINVAL;
  }
  sf_shard_reading *r = shard->reading;
  free(r->keep);
  if (keep && n > 1) qsort(keep, n, sizeof *keep, cmp_u64);
  r->keep = keep;
  r->n_keep = keep ? n : 0;
  return 0;
}

bool sf_shard_keeps(const sf_shard *shard, uint64_t index) {
  const sf_shard_reading *r = shard ? shard->reading : NULL;
  if (!r || !r->keep) return true;
  return bsearch(&index, r->keep, r->n_keep, sizeof *r->keep, cmp_u64) != NULL;
}

int sf_shard_set_range(sf_shard *shard, const sf_shard_range *range) {
  if (!shard || !shard->reading || !range || range->length < 1) return SF_EINVAL;
  char *etag = NULL, *index = NULL;
  if ((range->etag && range->etag[0] && !(etag = strdup(range->etag))) ||
      (range->index && !(index = strdup(range->index)))) {
    free(etag);
    return SF_ENOMEM;
  }
  sf_shard_reading *r = shard->reading;
  free((char *)r->range.etag);
  free((char *)r->range.index);
  r->range = *range;
  r->range.etag = etag;
  r->range.index = index;
  return 0;
}

bool sf_shard_range_of(const sf_shard *shard, sf_shard_range *range) {
  const sf_shard_reading *r = shard ? shard->reading : NULL;
  if (!r || r->range.length <= 0) {
    *range = (sf_shard_range){0};
    return false;
  }
  *range = r->range;
  return true;
}

/* The key of a sample that has none: shared, never freed. */
static char no_key[1];

/*
 * Sample structs come from 2 MiB slabs that ask for transparent huge pages, and go back to a free list, never
 * to the allocator. A sample is 2.7 KiB (SF_MAX_FIELDS fields) of which a stage touches the first few hundred
 * bytes, so a shuffle buffer of 10,000 samples from malloc faults in ~10,000 fresh 4 KiB pages, one by one on
 * tar_split's thread, while the buffer fills and nothing downstream can start (12,000 of the CIFAR graph's
 * 21,000 page faults a run), and the buffer's random reads spread over as many TLB entries. A slab is one
 * fault and one TLB entry where the kernel grants a huge page (plain pages where it does not). Made on one
 * thread and destroyed on another, a sample would also cost malloc's cross-thread free (~10x this locked
 * list). The slabs stay for the process's life, as many as the most samples alive at once needed. Compact
 * samples (a sample's bytes up to its last field: 400 bytes, a 448-byte slot, with two fields) come from the
 * same slabs, a free list for each count of fields; shuffle keeps its buffer so, which took a CIFAR run's
 * slabs from 27 MiB to 6, the zeroing of which (slow on a virtual machine, up to 100 ms) ran on tar_split's
 * thread while the buffer filled. Off under AddressSanitizer, which must see every allocation and free.
 */
#if defined(__SANITIZE_ADDRESS__)
enum { SAMPLE_SLABS = 0 };
#else
enum { SAMPLE_SLABS = 1 };
#endif
/* A compact sample (sf_sample_compact): a sample struct's bytes up to the end of its last field. */
static size_t compact_size(int n_fields) { return offsetof(sf_sample, fields) + (size_t)n_fields * sizeof(sf_field); }
/* Slot sizes: class 0 a whole sample struct, class n (1..SF_MAX_FIELDS) a compact sample of n fields. */
static size_t slot_size(int class) { return ((class ? compact_size(class) : sizeof(sf_sample)) + 63) / 64 * 64; }
enum { SLAB_BYTES = SF_HUGE_PAGE };
static pthread_mutex_t spare_lock = PTHREAD_MUTEX_INITIALIZER;
static void *spare[SF_MAX_FIELDS + 1]; /* a free list per class, linked through each slot's first word */
static uint8_t *slab_next, *slab_end; /* the rest of the newest slab */

/* A new slab, 2 MiB aligned (a huge page can back it only so), or NULL. Called with spare_lock held. */
static bool new_slab(void) {
  uint8_t *slab = sf_huge_map(SLAB_BYTES);
  if (!slab) return false;
#ifdef MADV_POPULATE_WRITE
  (void)madvise(slab, SLAB_BYTES, MADV_POPULATE_WRITE); /* one call, not a fault a page (Linux 5.14+) */
#endif
  slab_next = slab;
  slab_end = slab + SLAB_BYTES;
  return true;
}

/* A slot of the class, or NULL when out of memory. Called with spare_lock held. */
static void *take(int class) {
  void *slot = NULL;
  if (spare[class]) {
    slot = spare[class];
    memcpy(&spare[class], slot, sizeof(void *));
  } else if (slab_end - slab_next >= (ptrdiff_t)slot_size(class) || new_slab()) {
    slot = slab_next;
    slab_next += slot_size(class);
  }
  return slot;
}

/* Puts slot back on its class's free list. Called with spare_lock held. */
static void give(void *slot, int class) {
  memcpy(slot, &spare[class], sizeof(void *));
  spare[class] = slot;
}

static void *slot_alloc(int class) {
  if (!SAMPLE_SLABS) return malloc(slot_size(class));
  pthread_mutex_lock(&spare_lock);
  void *slot = take(class);
  pthread_mutex_unlock(&spare_lock);
  return slot;
}

static void slot_free(void *slot, int class) {
  if (!SAMPLE_SLABS) {
    free(slot);
    return;
  }
  pthread_mutex_lock(&spare_lock);
  give(slot, class);
  pthread_mutex_unlock(&spare_lock);
}

/*
 * The first `size` bytes of slot `from` (of class from_class, then freed) in a new slot of class to_class, under
 * one lock: a sample compacted or expanded. Returns the new slot, or NULL when out of memory (from untouched).
 */
static void *slot_move(void *from, int from_class, int to_class, size_t size) {
  if (!SAMPLE_SLABS) {
    void *to = malloc(slot_size(to_class));
    if (to) {
      memcpy(to, from, size);
      free(from);
    }
    return to;
  }
  pthread_mutex_lock(&spare_lock);
  void *to = take(to_class);
  if (to) {
    memcpy(to, from, size);
    give(from, from_class);
  }
  pthread_mutex_unlock(&spare_lock);
  return to;
}

static sf_sample *sample_alloc(void) { return slot_alloc(0); }
static void sample_free(sf_sample *s) { slot_free(s, 0); }

sf_sample *sf_sample_new(void) {
  sf_sample *s = sample_alloc();
  if (!s) return NULL;
  /* Zero the header only: fields past n_fields are never read. */
  memset(s, 0, offsetof(sf_sample, fields));
  s->key = no_key;
  s->offset = -1;
  return s;
}

int sf_sample_set_key(sf_sample *s, const char *key, size_t len) {
  char *copy = malloc(len + 1);
  if (!copy) return SF_ENOMEM;
  memcpy(copy, key, len);
  copy[len] = '\0';
  free(sf_sample_take_key(s));
  s->key = copy;
  return 0;
}

char *sf_sample_take_key(sf_sample *s) {
  char *key = s->key == no_key ? NULL : s->key;
  s->key = no_key;
  return key;
}

/* Drops a field's tensor reference and its recipe. */
static void field_clear(sf_field *f) {
  sf_tensor_clear(&f->tensor);
  if (f->recipe) f->recipe->destroy(f->recipe);
  f->recipe = NULL;
}

/* Drops what a sample holds: its fields' references and recipes, its URL and its key. */
static void release(sf_sample *s) {
  for (int i = 0; i < s->n_fields; i++) field_clear(&s->fields[i]);
  sf_buffer_unref(&s->url);
  free(sf_sample_take_key(s));
}

void sf_sample_destroy(sf_sample **ps) {
  if (!ps || !*ps) return;
  sf_sample *s = *ps;
  release(s);
  *ps = NULL;
  sample_free(s);
}

sf_compact_sample *sf_sample_compact(sf_sample **ps) {
  /* a class of its own for each count of fields: no sizes to keep; the references move with the bytes */
  sf_compact_sample *c = slot_move(*ps, 0, (*ps)->n_fields, compact_size((*ps)->n_fields));
  if (c) *ps = NULL;
  return c;
}

sf_sample *sf_compact_sample_expand(sf_compact_sample **pc) {
  int n = ((const sf_sample *)(const void *)*pc)->n_fields;
  sf_sample *s = slot_move(*pc, n, 0, compact_size(n));
  if (s) *pc = NULL;
  return s;
}

const sf_field *sf_compact_sample_fields(const sf_compact_sample *compact, int *n_fields, uint64_t *epoch) {
  const sf_sample *s = (const sf_sample *)(const void *)compact;
  *n_fields = s->n_fields;
  if (epoch) *epoch = s->epoch;
  return s->fields;
}

void sf_compact_sample_destroy(sf_compact_sample **pc) {
  if (!pc || !*pc) return;
  sf_sample *s = (sf_sample *)(void *)*pc; /* a sample's bytes up to its last field: release() reads no further */
  int n = s->n_fields;
  release(s);
  slot_free(*pc, n);
  *pc = NULL;
}

const char *sf_sample_url(const sf_sample *s) {
  return s->url ? (const char *)sf_buffer_data(s->url) : "";
}

sf_field *sf_sample_field(sf_sample *s, const char *name) {
  for (int i = 0; i < s->n_fields; i++)
    if (strcmp(s->fields[i].name, name) == 0) return &s->fields[i];
  return NULL;
}

sf_field *sf_sample_add_field(sf_sample *s, const char *name, bool encoded, sf_tensor *tensor) {
  size_t len = strlen(name);
  if (s->n_fields >= SF_MAX_FIELDS || len >= SF_FIELD_NAME_MAX) {
    sf_tensor_clear(tensor);
    return NULL;
  }
  sf_field *f = &s->fields[s->n_fields++];
  memcpy(f->name, name, len + 1);
  f->encoded = encoded;
  f->tensor = *tensor;
  f->recipe = NULL;
  memset(tensor, 0, sizeof *tensor);
  return f;
}

int sf_field_defer(sf_field *f, sf_dtype dtype, int ndim, const int64_t *shape, sf_field_recipe *recipe) {
  sf_tensor header;
  if (sf_tensor_set_shape(&header, dtype, ndim, shape) < 0) {
    recipe->destroy(recipe);
    return SF_EINVAL;
  }
  field_clear(f);
  f->encoded = false;
  f->tensor = header;
  f->recipe = recipe;
  return 0;
}

int sf_field_materialize(sf_field *f) {
  if (!f->recipe) return 0;
  sf_tensor t;
  int r = sf_tensor_alloc(&t, f->tensor.dtype, f->tensor.ndim, f->tensor.shape);
  if (r < 0) return r;
  f->recipe->write(f->recipe, sf_tensor_data(&t));
  f->recipe->destroy(f->recipe);
  f->recipe = NULL;
  f->tensor = t; /* the header had no buffer to drop */
  return 0;
}

void sf_sample_remove_field(sf_sample *s, int i) {
  if (i < 0 || i >= s->n_fields) return;
  field_clear(&s->fields[i]);
  memmove(&s->fields[i], &s->fields[i + 1], (size_t)(s->n_fields - i - 1) * sizeof s->fields[0]);
  s->n_fields--;
}

sf_batch *sf_batch_new(int64_t size) {
  if (size < 0) return NULL;
  sf_batch *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->size = size;
  b->keys = calloc(size ? (size_t)size : 1, sizeof b->keys[0]);
  b->origins = calloc(size ? 2 * (size_t)size : 1, sizeof b->origins[0]);
  if (!b->keys || !b->origins) {
    free(b->keys);
    free(b->origins);
    free(b);
    return NULL;
  }
  return b;
}

void sf_batch_destroy(sf_batch **pb) {
  if (!pb || !*pb) return;
  sf_batch *b = *pb;
  for (int i = 0; i < b->n_fields; i++) field_clear(&b->fields[i]);
  for (int64_t j = 0; j < b->size; j++) free(b->keys[j]);
  free(b->keys);
  free(b->origins);
  free(b);
  *pb = NULL;
}

const sf_field *sf_batch_field(const sf_batch *b, const char *name) {
  for (int i = 0; i < b->n_fields; i++)
    if (strcmp(b->fields[i].name, name) == 0) return &b->fields[i];
  return NULL;
}

/* The int64 or int32 entry j of batch field NAME.suffix, or -1 when there is no such 1-D field. */
static int64_t companion(const sf_batch *b, const char *name, const char *suffix, int64_t j) {
  char full[SF_FIELD_NAME_MAX + 16];
  snprintf(full, sizeof full, "%s.%s", name, suffix);
  const sf_field *f = sf_batch_field(b, full);
  if (!f || f->tensor.ndim != 1 || j >= f->tensor.shape[0]) return -1;
  const char *p = (const char *)sf_tensor_data(&f->tensor) + (size_t)(j * f->tensor.strides[0]) * sf_dtype_size(f->tensor.dtype);
  if (f->tensor.dtype == SF_DTYPE_INT64) return *(const int64_t *)p;
  return f->tensor.dtype == SF_DTYPE_INT32 ? *(const int32_t *)p : -1;
}

int sf_batch_sample_view(const sf_batch *b, const char *name, int64_t j, sf_tensor *view) {
  memset(view, 0, sizeof *view);
  const sf_field *f = sf_batch_field(b, name);
  if (!f || j < 0 || j >= b->size || f->tensor.ndim < 1) return SF_EINVAL;
  sf_tensor v = f->tensor;
  size_t item = sf_dtype_size(v.dtype);
  int64_t start = companion(b, name, "offsets", j), end = companion(b, name, "offsets", j + 1);
  if (start >= 0) { /* ragged: values[offsets[j]:offsets[j+1]] */
    if (end < start || end > v.shape[0]) return SF_EINVAL;
    v.offset += (size_t)(start * v.strides[0]) * item;
    v.shape[0] = end - start;
  } else { /* fixed or padded: row j, cut to NAME.length[j] when there is one */
    v.offset += (size_t)(j * v.strides[0]) * item;
    v.ndim--;
    memmove(v.shape, v.shape + 1, (size_t)v.ndim * sizeof v.shape[0]);
    memmove(v.strides, v.strides + 1, (size_t)v.ndim * sizeof v.strides[0]);
    int64_t length = companion(b, name, "length", j);
    if (length >= 0 && v.ndim == 1 && length <= v.shape[0]) v.shape[0] = length;
  }
  sf_tensor_ref(view, &v);
  return 0;
}

void sf_item_clear(sf_item *item) {
  switch (item->kind) {
  case SF_ITEM_SHARD: sf_shard_destroy(&item->u.shard); break;
  case SF_ITEM_SAMPLE: sf_sample_destroy(&item->u.sample); break;
  case SF_ITEM_BATCH: sf_batch_destroy(&item->u.batch); break;
  default: break;
  }
  item->kind = SF_ITEM_NONE;
}

size_t sf_item_nbytes(const sf_item *item) {
  const sf_field *fields = item->kind == SF_ITEM_SAMPLE  ? item->u.sample->fields
                           : item->kind == SF_ITEM_BATCH ? item->u.batch->fields
                                                         : NULL;
  int n = item->kind == SF_ITEM_SAMPLE ? item->u.sample->n_fields : item->kind == SF_ITEM_BATCH ? item->u.batch->n_fields : 0;
  size_t bytes = 0;
  for (int i = 0; i < n; i++) bytes += sf_tensor_nbytes(&fields[i].tensor);
  return bytes;
}

int64_t sf_batch_size(const sf_batch *b) { return b->size; }
uint64_t sf_batch_epoch(const sf_batch *b) { return b->epoch; }
int sf_batch_field_count(const sf_batch *b) { return b->n_fields; }

const char *sf_batch_field_name(const sf_batch *b, int i) {
  return i >= 0 && i < b->n_fields ? b->fields[i].name : NULL;
}

const char *sf_batch_key(const sf_batch *b, int64_t j) {
  if (j < 0 || j >= b->size) return NULL;
  return b->keys[j] ? b->keys[j] : "";
}

int sf_batch_origin(const sf_batch *b, int64_t j, uint64_t *shard_index, uint64_t *sample_index) {
  if (j < 0 || j >= b->size) return SF_EINVAL;
  *shard_index = b->origins[2 * j];
  *sample_index = b->origins[2 * j + 1];
  return 0;
}

int sf_port_count(const sf_port_def *ports) {
  int n = 0;
  while (ports && ports[n].kind != SF_PORT_NONE) n++;
  return n;
}

sf_port_kind sf_port_first_kind(const sf_port_def *ports) { return ports ? ports[0].kind : SF_PORT_NONE; }

/* The row that stands for port p: a fixed row, or the template (a last row whose name has "%u"); -1 for none. */
static int port_row(const sf_port_def *ports, int p) {
  int rows = sf_port_count(ports);
  if (p < 0 || rows == 0) return -1;
  if (p < rows - 1) return p;
  const char *last = ports[rows - 1].name;
  if (last && strstr(last, "%u")) return p < SF_NODE_INPUTS_MAX ? rows - 1 : -1; /* sf_port_capacity */
  return p == rows - 1 ? p : -1;
}

int sf_port_capacity(const sf_port_def *ports) {
  int rows = sf_port_count(ports);
  const char *last = rows ? ports[rows - 1].name : NULL;
  return last && strstr(last, "%u") ? SF_NODE_INPUTS_MAX : rows;
}

sf_port_kind sf_port_kind_at(const sf_port_def *ports, int port) {
  int row = port_row(ports, port);
  return row < 0 ? SF_PORT_NONE : ports[row].kind;
}

int sf_port_name_at(const sf_port_def *ports, int port, char *buf, size_t size) {
  int row = port_row(ports, port);
  if (row < 0) return -1;
  const char *name = ports[row].name ? ports[row].name : "", *at = strstr(name, "%u");
  if (!at) return snprintf(buf, size, "%s", name);
  /* The number put in by hand: the name is the stage's text, never a format. */
  int n = (int)(at - name);
  return snprintf(buf, size, "%.*s%d%s", n, name, port - row, at + 2);
}
