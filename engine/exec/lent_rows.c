/* Rows a consumer lends its producers: see lent_rows.h. */
#include "lent_rows.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/error.h"

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
  uint64_t full_until; /* slabs numbered below it and not kept were all lent: none is made again */
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

/* Slab `number` (borrowed), made when it is newer than every slab kept, else NULL. Called locked. */
static slab *slab_of(sf_lent_rows *l, uint64_t number) {
  int slot = -1; /* an empty one, else the oldest */
  for (int i = 0; i < KEPT; i++) {
    if (l->kept[i].buffer && l->kept[i].number == number) return &l->kept[i];
    if (slot >= 0 && !l->kept[slot].buffer) continue;
    if (!l->kept[i].buffer || slot < 0 || l->kept[i].number < l->kept[slot].number) slot = i;
  }
  slab *s = &l->kept[slot];
  if (number < l->full_until || (s->buffer && s->number > number)) return NULL; /* far behind: not a slab */
  sf_buffer *b = sf_pool_get(l->pool, l->row_bytes * (size_t)l->rows);
  uint8_t *lent = calloc((size_t)l->rows, 1);
  if (!b || !lent) {
    sf_buffer_unref(&b);
    free(lent);
    return NULL;
  }
  drop_slab(s);
  *s = (slab){.number = number, .buffer = b, .lent = lent};
  return s;
}

int sf_lent_rows_borrow(sf_lent_rows *l, uint64_t p, sf_dtype dtype, int ndim, const int64_t *shape, sf_tensor *row) {
  pthread_mutex_lock(&l->lock);
  int r = 0;
  if (l->row.ndim == 0 && sf_tensor_set_shape(&l->row, dtype, ndim, shape) == 0) l->row_bytes = sf_tensor_nbytes(&l->row);
  if (p >= l->base && l->row_bytes && same_row(&l->row, dtype, ndim, shape)) {
    uint64_t k = p - l->base, at = k % (uint64_t)l->rows;
    slab *s = slab_of(l, k / (uint64_t)l->rows);
    if (s && !s->lent[at]) {
      r = sf_tensor_view(row, dtype, ndim, shape, sf_buffer_ref(s->buffer), (size_t)at * l->row_bytes) == 0 ? 1 : 0;
      s->lent[at] = 1;
      l->lent += (uint64_t)r;
      if (++s->n_lent == l->rows) { /* all lent: back to the pool once its rows are done */
        if (s->number >= l->full_until) l->full_until = s->number + 1;
        drop_slab(s);
      }
    }
  }
  pthread_mutex_unlock(&l->lock);
  return r;
}

void sf_lent_rows_placed(sf_lent_rows *l, uint64_t p, int64_t at) {
  pthread_mutex_lock(&l->lock);
  const uint64_t rows = (uint64_t)l->rows;
  /* where p's row lies: (p - base) mod rows, for p before base too */
  uint64_t lies = p >= l->base ? (p - l->base) % rows : (rows - (l->base - p) % rows) % rows;
  if (lies != (uint64_t)at) {
    l->base = p - (uint64_t)at + rows; /* the position the next batch starts with */
    l->full_until = 0;
    drop_slabs(l);
    l->realigned++;
  }
  pthread_mutex_unlock(&l->lock);
}

void sf_lent_rows_counts(sf_lent_rows *l, uint64_t *lent, uint64_t *realigned) {
  pthread_mutex_lock(&l->lock);
  *lent = l->lent, *realigned = l->realigned;
  pthread_mutex_unlock(&l->lock);
}
