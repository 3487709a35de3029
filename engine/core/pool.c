/* Buffer pools: idle buffers on a mutex-protected free list, returned by the buffer's free callback. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_freer.h"
#include "pin.h"
#include "shardflow/pool.h"

typedef struct idle {
  struct idle *next;
  size_t size;
} idle;

struct sf_pool {
  atomic_size_t refs; /* the owner's reference plus one per buffer out */
  pthread_mutex_t lock;
  idle *free_list;
  size_t n_free, max_free, allocated;
  bool pinned;  /* buffers are registered with cudaHostRegister (engine/core/pin.c) */
};

sf_pool *sf_pool_new(size_t max_free) {
  sf_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  atomic_init(&p->refs, 1);
  pthread_mutex_init(&p->lock, NULL);
  p->max_free = max_free;
  return p;
}

/* Frees one allocation for good (unpinning it first when the pool pins). */
static void drop(const sf_pool *p, idle *i) {
  if (p->pinned) sf_unpin(i);
  free(i);
}

int sf_pool_pin(sf_pool *p, sf_error *error) {
  int r = sf_pin_open(error);
  if (r == SF_ENOMEM) return sf_error_set(error, r, SF_NOWHERE, "pin_memory: out of memory probing the CUDA runtime");
  if (r < 0) return r;
  p->pinned = true;
  return 0;
}

static void release(sf_pool *p) {
  if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) != 1) return;
  for (idle *i = p->free_list, *next; i; i = next) {
    next = i->next;
    drop(p, i);
  }
  pthread_mutex_destroy(&p->lock);
  free(p);
}

void sf_pool_unref(sf_pool **pp) {
  if (!pp || !*pp) return;
  release(*pp);
  *pp = NULL;
}

/* Idle buffers keep their size in a header in front of the data (64 bytes keeps alignment). */
enum { HEADER = 64 };

static void give_back(void *opaque, uint8_t *data) {
  sf_pool *p = opaque;
  idle *i = (idle *)(data - HEADER);
  pthread_mutex_lock(&p->lock);
  if (p->n_free < p->max_free) {
    i->next = p->free_list;
    p->free_list = i;
    p->n_free++;
    i = NULL;
  }
  pthread_mutex_unlock(&p->lock);
  if (i) drop(p, i);
  release(p);
}

sf_buffer *sf_pool_get(sf_pool *p, size_t size) {
  idle *got = NULL;
  pthread_mutex_lock(&p->lock);
  for (idle **link = &p->free_list; *link; link = &(*link)->next) {
    if ((*link)->size == size) {
      got = *link;
      *link = got->next;
      p->n_free--;
      break;
    }
  }
  pthread_mutex_unlock(&p->lock);
  if (!got) {
    if (size > SIZE_MAX - HEADER - 64) return NULL;
    got = aligned_alloc(64, (HEADER + size + 63) & ~(size_t)63);
    if (!got) return NULL;
    if (p->pinned && sf_pin(got, HEADER + size) < 0) { /* pinned memory ran out: reported as out of memory */
      free(got);
      return NULL;
    }
    got->size = size;
    pthread_mutex_lock(&p->lock);
    p->allocated++;
    pthread_mutex_unlock(&p->lock);
  }
  atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
  sf_buffer *b = sf_buffer_wrap((uint8_t *)got + HEADER, size, give_back, p);
  if (!b) give_back(p, (uint8_t *)got + HEADER);
  return b;
}

bool sf_pool_owns(const sf_pool *p, const sf_buffer *b) {
  void *opaque;
  return p && sf_buffer_freer(b, &opaque) == give_back && opaque == p;
}

size_t sf_pool_allocated(const sf_pool *p) {
  pthread_mutex_lock((pthread_mutex_t *)&p->lock);
  size_t n = p->allocated;
  pthread_mutex_unlock((pthread_mutex_t *)&p->lock);
  return n;
}

int sf_pool_tensor(sf_pool *p, sf_tensor *t, sf_dtype dtype, int ndim, const int64_t *shape) {
  int r = sf_tensor_set_shape(t, dtype, ndim, shape);
  if (r < 0) return r;
  t->buffer = sf_pool_get(p, sf_tensor_nbytes(t));
  if (!t->buffer) {
    memset(t, 0, sizeof *t);
    return SF_ENOMEM;
  }
  return 0;
}
