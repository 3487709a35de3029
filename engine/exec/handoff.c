/* The handoff (include/shardflow/handoff.h): a ring of items between a non-blocking stage and one program thread. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shardflow/handoff.h"

enum { PENDING, TAKEN, DONE };

typedef struct slot {
  sf_item item;
  int state;
  int status;
  char *message;
} slot;

struct sf_handoff {
  atomic_int refs;
  pthread_mutex_t lock;
  pthread_cond_t cond; /* a sample to take, or closed */
  slot *slots;
  int capacity, head, count, taken; /* taken: slots from head already handed out or passed through */
  bool closed;
  /* Waking the pool costs more than a sample's map (a context switch), so results are announced in
   * bunches: when the stage found nothing done and half the ring is done, or the program's thread
   * has nothing more to take. */
  bool stage_waits;
  int done_unannounced;
  sf_sample *orphan; /* the sample the program's thread held when the handoff closed; freed by its finish */
  void (*wake)(sf_node *);
  sf_node *wake_node;
};

int sf_handoff_new(sf_handoff **out, int capacity) {
  *out = NULL;
  if (capacity < 1 || capacity > 65536) return SF_EINVAL;
  sf_handoff *h = calloc(1, sizeof *h);
  if (!h || !(h->slots = calloc((size_t)capacity, sizeof *h->slots))) {
    free(h);
    return SF_ENOMEM;
  }
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&h->cond, &attr);
  pthread_condattr_destroy(&attr);
  pthread_mutex_init(&h->lock, NULL);
  h->capacity = capacity;
  atomic_init(&h->refs, 1);
  *out = h;
  return 0;
}

sf_handoff *sf_handoff_ref(sf_handoff *h) {
  if (h) atomic_fetch_add_explicit(&h->refs, 1, memory_order_relaxed);
  return h;
}

/* Frees everything still inside; caller holds the lock. */
static void drain(sf_handoff *h) {
  for (; h->count > 0; h->count--, h->head = (h->head + 1) % h->capacity) {
    slot *s = &h->slots[h->head];
    sf_item_clear(&s->item);
    free(s->message);
    s->message = NULL;
  }
  h->taken = 0;
}

void sf_handoff_unref(sf_handoff **ph) {
  sf_handoff *h = ph ? *ph : NULL;
  if (!h) return;
  *ph = NULL;
  if (atomic_fetch_sub_explicit(&h->refs, 1, memory_order_acq_rel) != 1) return;
  drain(h);
  sf_sample_destroy(&h->orphan);
  pthread_mutex_destroy(&h->lock);
  pthread_cond_destroy(&h->cond);
  free(h->slots);
  free(h);
}

void sf_handoff_close(sf_handoff *h) {
  pthread_mutex_lock(&h->lock);
  h->closed = true;
  /* The program's thread may still read the sample it holds: its finish frees it. */
  for (int i = 0; i < h->taken && !h->orphan; i++) {
    slot *s = &h->slots[(h->head + i) % h->capacity];
    if (s->state == TAKEN) h->orphan = s->item.u.sample, s->item.kind = SF_ITEM_NONE;
  }
  drain(h);
  pthread_cond_broadcast(&h->cond);
  pthread_mutex_unlock(&h->lock);
}

void sf_handoff_set_wake(sf_handoff *h, void (*fn)(sf_node *), sf_node *node) {
  pthread_mutex_lock(&h->lock);
  h->wake = fn;
  h->wake_node = node;
  pthread_mutex_unlock(&h->lock);
}

bool sf_handoff_can_put(sf_handoff *h) {
  pthread_mutex_lock(&h->lock);
  bool room = !h->closed && h->count < h->capacity;
  pthread_mutex_unlock(&h->lock);
  return room;
}

int sf_handoff_in_flight(sf_handoff *h) {
  pthread_mutex_lock(&h->lock);
  int n = h->count;
  pthread_mutex_unlock(&h->lock);
  return n;
}

int sf_handoff_put(sf_handoff *h, sf_item *item) {
  pthread_mutex_lock(&h->lock);
  if (h->closed || h->count == h->capacity) {
    pthread_mutex_unlock(&h->lock);
    return SF_EAGAIN;
  }
  slot *s = &h->slots[(h->head + h->count++) % h->capacity];
  *s = (slot){.item = *item, .state = item->kind == SF_ITEM_SAMPLE ? PENDING : DONE};
  *item = (sf_item){.kind = SF_ITEM_NONE};
  pthread_cond_signal(&h->cond);
  pthread_mutex_unlock(&h->lock);
  return 0;
}

int sf_handoff_get(sf_handoff *h, sf_item *item, int *status, char *message, size_t size) {
  pthread_mutex_lock(&h->lock);
  slot *s = &h->slots[h->head];
  if (h->count == 0 || s->state != DONE) {
    h->stage_waits = true;
    pthread_mutex_unlock(&h->lock);
    return SF_EAGAIN;
  }
  *item = s->item;
  *status = s->status;
  if (size) snprintf(message, size, "%s", s->message ? s->message : "");
  free(s->message);
  *s = (slot){0};
  h->head = (h->head + 1) % h->capacity;
  h->count--;
  if (h->taken > 0) h->taken--;
  pthread_mutex_unlock(&h->lock);
  return 0;
}

/* Wakes the stage if it waits for results that are there; caller holds the lock. */
static void announce(sf_handoff *h) {
  if (h->wake && h->stage_waits && h->done_unannounced > 0) {
    h->wake(h->wake_node);
    h->stage_waits = false;
    h->done_unannounced = 0;
  }
}

int sf_handoff_take(sf_handoff *h, sf_sample **sample, double timeout) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  if (timeout >= 0) {
    until.tv_sec += (time_t)timeout;
    until.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&h->lock);
  int r = 0;
  for (;;) {
    if (h->closed) {
      r = SF_EOF;
      break;
    }
    /* Markers between samples are done already: step over them. */
    while (h->taken < h->count && h->slots[(h->head + h->taken) % h->capacity].state == DONE) h->taken++;
    if (h->taken < h->count) {
      slot *s = &h->slots[(h->head + h->taken++) % h->capacity];
      s->state = TAKEN;
      *sample = s->item.u.sample;
      break;
    }
    announce(h); /* about to wait: what is done must go on meanwhile */
    if (timeout < 0)
      pthread_cond_wait(&h->cond, &h->lock);
    else if (pthread_cond_timedwait(&h->cond, &h->lock, &until) != 0) {
      r = SF_ETIMEDOUT;
      break;
    }
  }
  pthread_mutex_unlock(&h->lock);
  return r;
}

void sf_handoff_finish(sf_handoff *h, sf_sample **result, int status, const char *message) {
  pthread_mutex_lock(&h->lock);
  slot *s = NULL;
  for (int i = 0; i < h->taken && !h->closed; i++) {
    slot *t = &h->slots[(h->head + i) % h->capacity];
    if (t->state == TAKEN) s = t;
  }
  if (!s) { /* closed meanwhile: the taken sample was left to us */
    sf_sample *orphan = h->orphan;
    h->orphan = NULL;
    pthread_mutex_unlock(&h->lock);
    sf_sample_destroy(&orphan);
    sf_sample_destroy(result);
    return;
  }
  if (status == SF_HANDOFF_PASS && result && *result) {
    sf_sample_destroy(&s->item.u.sample);
    s->item.u.sample = *result;
    *result = NULL;
  }
  s->status = status;
  s->message = status < 0 && message ? strdup(message) : NULL;
  s->state = DONE;
  if (++h->done_unannounced * 2 >= h->capacity) announce(h);
  pthread_mutex_unlock(&h->lock);
  sf_sample_destroy(result);
}

const char *sf_sample_key(const sf_sample *s) { return s->key; }

int sf_sample_field_count(const sf_sample *s) { return s->n_fields; }

const sf_field *sf_sample_field_at(sf_sample *s, int i) {
  if (i < 0 || i >= s->n_fields) return NULL;
  return sf_field_materialize(&s->fields[i]) == 0 ? &s->fields[i] : NULL;
}

sf_sample *sf_sample_derive(const sf_sample *src) {
  sf_sample *s = sf_sample_new();
  if (!s) return NULL;
  if (src->key[0] && sf_sample_set_key(s, src->key, strlen(src->key)) < 0) {
    sf_sample_destroy(&s);
    return NULL;
  }
  s->url = src->url ? sf_buffer_ref(src->url) : NULL;
  s->epoch = src->epoch;
  s->shard_index = src->shard_index;
  s->index = src->index;
  s->pass = src->pass;
  s->offset = src->offset;
  return s;
}

/* Checks name is free and appends tensor (consumed). */
static int add(sf_sample *s, const char *name, bool encoded, sf_tensor *t) {
  if (sf_sample_field(s, name)) {
    sf_tensor_clear(t);
    return SF_EDUP;
  }
  return sf_sample_add_field(s, name, encoded, t) ? 0 : SF_EINVAL;
}

int sf_sample_add_field_copy(sf_sample *s, const char *name, bool encoded, sf_dtype dtype, int ndim,
                             const int64_t *shape, const void *data) {
  sf_tensor t = {0};
  int r = sf_tensor_alloc(&t, dtype, ndim, shape);
  if (r < 0) return r;
  memcpy(sf_tensor_data(&t), data, sf_tensor_nbytes(&t));
  return add(s, name, encoded, &t);
}

int sf_sample_add_field_ref(sf_sample *s, const char *name, sf_sample *src, int i) {
  const sf_field *f = sf_sample_field_at(src, i);
  if (!f) return i < 0 || i >= src->n_fields ? SF_EINVAL : SF_ENOMEM;
  sf_tensor t = {0};
  sf_tensor_ref(&t, &f->tensor);
  return add(s, name, f->encoded, &t);
}
