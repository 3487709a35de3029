/* Rows a consumer lends its producers: see lent_rows.h. */
#include "lent_rows.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Slabs kept while rows of them are still to lend: producers run ahead of each other by up to a few batches. */
enum { KEPT = 8 };

typedef struct slab {
  uint64_t number; /* (position - base) / rows */
  sf_buffer *buffer;
  uint8_t *lent;   /* per row: lent already (a row is never lent twice, whatever the positions say) */
  int64_t n_lent;
} slab;

struct sf_lent_rows {
  pthread_mutex_t lock;
  sf_pool *pool;
  int64_t rows;
  uint64_t base;       /* position of row 0 of slab 0 */
  sf_tensor row;       /* the rows' dtype and shape, no buffer (ndim 0 until the first borrow) */
  size_t row_bytes;
  slab kept[KEPT];     /* buffer NULL: empty */
  uint64_t full_until; /* slabs numbered below it and not kept were all lent or passed: none is made again */
  uint64_t frontier;   /* one past the furthest position producers asked for */
  uint64_t lent, realigned;
};

sf_lent_rows *sf_lent_rows_new(sf_pool *pool, int64_t rows) {
  sf_lent_rows *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  pthread_mutex_init(&l->lock, NULL);
  l->pool = pool;
  l->rows = rows;
  return l;
}

static void drop_slab(slab *s) {
  sf_buffer_unref(&s->buffer); /* the rows lent from it keep it */
  free(s->lent);
  s->lent = NULL;
}

static void drop_slabs(sf_lent_rows *l) {
  for (int i = 0; i < KEPT; i++) drop_slab(&l->kept[i]);
}

void sf_lent_rows_free(sf_lent_rows *l) {
  if (!l) return;
  drop_slabs(l);
  pthread_mutex_destroy(&l->lock);
  free(l);
}

static bool same_row(const sf_tensor *a, sf_dtype dtype, int ndim, const int64_t *shape) {
  return a->dtype == dtype && a->ndim == ndim && memcmp(a->shape, shape, (size_t)ndim * sizeof shape[0]) == 0;
}

/* The kept slab numbered `number`, or NULL. Called locked. */
static slab *find(sf_lent_rows *l, uint64_t number) {
  for (int i = 0; i < KEPT; i++)
    if (l->kept[i].buffer && l->kept[i].number == number) return &l->kept[i];
  return NULL;
}

/* Where a new slab `number` goes (an empty slot, else the oldest's), or NULL when it is older than that or
 * than full_until: a producer far behind, given memory of its own. Called locked. */
static slab *slot_for(sf_lent_rows *l, uint64_t number) {
  slab *s = NULL;
  for (int i = 0; i < KEPT && !(s && !s->buffer); i++)
    if (!s || !l->kept[i].buffer || l->kept[i].number < s->number) s = &l->kept[i];
  return number < l->full_until || (s->buffer && s->number > number) ? NULL : s;
}

int sf_lent_rows_borrow(sf_lent_rows *l, uint64_t p, sf_dtype dtype, int ndim, const int64_t *shape, sf_tensor *row) {
  sf_buffer *fresh = NULL; /* a new slab's memory, taken outside the lock (a pinned pool registers it: slow) */
  uint8_t *fresh_lent = NULL;
  int r = 0;
  pthread_mutex_lock(&l->lock);
  if (p >= l->frontier) l->frontier = p + 1;
  for (;;) {
    if (l->row.ndim == 0 && sf_tensor_set_shape(&l->row, dtype, ndim, shape) == 0) l->row_bytes = sf_tensor_nbytes(&l->row);
    if (p < l->base || !l->row_bytes || !same_row(&l->row, dtype, ndim, shape)) break;
    const uint64_t k = p - l->base, number = k / (uint64_t)l->rows, at = k % (uint64_t)l->rows;
    const size_t bytes = l->row_bytes * (size_t)l->rows;
    slab *s = find(l, number);
    if (!s) {
      slab *slot = slot_for(l, number);
      if (!slot) break;
      if (fresh && sf_buffer_size(fresh) != bytes) break; /* the rows changed shape meanwhile */
      if (!fresh) {
        pthread_mutex_unlock(&l->lock);
        fresh = sf_pool_get(l->pool, bytes);
        fresh_lent = calloc((size_t)l->rows, 1);
        pthread_mutex_lock(&l->lock);
        if (!fresh || !fresh_lent) break;
        continue; /* the slabs may have moved meanwhile: look again */
      }
      drop_slab(slot);
      *slot = (slab){.number = number, .buffer = fresh, .lent = fresh_lent};
      fresh = NULL, fresh_lent = NULL;
      s = slot;
    }
    if (!s->lent[at]) {
      r = sf_tensor_view(row, dtype, ndim, shape, sf_buffer_ref(s->buffer), (size_t)at * l->row_bytes) == 0 ? 1 : 0;
      s->lent[at] = 1;
      l->lent += (uint64_t)r;
      if (++s->n_lent == l->rows) { /* all lent: back to the pool once its rows are done */
        if (s->number >= l->full_until) l->full_until = s->number + 1;
        drop_slab(s);
      }
    }
    break;
  }
  pthread_mutex_unlock(&l->lock);
  sf_buffer_unref(&fresh);
  free(fresh_lent);
  return r;
}

void sf_lent_rows_placed(sf_lent_rows *l, uint64_t p, int64_t at) {
  pthread_mutex_lock(&l->lock);
  const uint64_t rows = (uint64_t)l->rows;
  /* where p's row lies: (p - base) mod rows, for p before base too */
  uint64_t lies = p >= l->base ? (p - l->base) % rows : (rows - (l->base - p) % rows) % rows;
  if (lies != (uint64_t)at) {
    /* The rows start afresh at a batch's first position, past every position producers have borrowed for:
       rows borrowed under the old layout are copied anyway, and slabs made for them would be wasted. */
    uint64_t next = p - (uint64_t)at + rows;
    while (next < l->frontier) next += rows;
    l->base = next;
    l->full_until = 0;
    l->row = (sf_tensor){0}; /* the next borrow says the rows' shape again */
    l->row_bytes = 0;
    drop_slabs(l);
    l->realigned++;
  } else if (p >= l->base) {
    /* Slabs wholly before p get no more borrowers (positions before p were all produced): let them go. */
    uint64_t number = (p - l->base) / rows;
    for (int i = 0; i < KEPT; i++)
      if (l->kept[i].buffer && l->kept[i].number < number) drop_slab(&l->kept[i]);
    if (number > l->full_until) l->full_until = number;
  }
  pthread_mutex_unlock(&l->lock);
}

void sf_lent_rows_counts(sf_lent_rows *l, uint64_t *lent, uint64_t *realigned) {
  pthread_mutex_lock(&l->lock);
  *lent = l->lent, *realigned = l->realigned;
  pthread_mutex_unlock(&l->lock);
}
