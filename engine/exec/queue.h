/* Bounded single-consumer queues of items between nodes, with wake-up hysteresis. */
#ifndef SF_ENGINE_QUEUE_H
#define SF_ENGINE_QUEUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "shardflow/stage.h"

/*
 * A ring of items with one consumer and one or more producers, bounded in
 * items (capacity) and in bytes (max_bytes: the samples' and batches' tensor
 * bytes; a queue always takes one item, however large). The bound is soft:
 * push never fails (the ring grows), because the engine only steps a
 * producer while can_push() holds, so at most a step's worth of items goes
 * past the bound. A waiting consumer is woken when `wake_at` items are queued
 * (or an epoch end / close arrives) and a waiting producer when the count
 * falls to half the capacity: threads then trade items in runs, not one by one.
 */
/* A queued item with its tensor bytes, counted once when it is pushed (outside the lock). */
typedef struct sf_queue_slot {
  sf_item item;
  size_t bytes;
} sf_queue_slot;

typedef struct sf_queue {
  pthread_mutex_t lock;
  pthread_cond_t readable, writable;
  sf_queue_slot *ring;
  size_t cap_alloc, head, count;
  size_t capacity, wake_at;
  size_t bytes, max_bytes;  /* tensor bytes queued, and the bound (SIZE_MAX = items only) */
  int producers;            /* still open */
  bool consumer_waiting;
  int producers_waiting;
  int notify_fd;            /* eventfd kept readable while the consumer has something, or -1 */
  struct sf_lent_rows *lender; /* rows the consumer lends its producers (sf_node_lend_rows), or NULL: set before
                                  the pipeline runs, owned by the consumer's node */
  bool fd_ready;
} sf_queue;

int sf_queue_init(sf_queue *q, size_t capacity, size_t wake_at, int producers);
/* Bounds the queue in bytes as well (before any thread uses it). */
void sf_queue_set_max_bytes(sf_queue *q, size_t max_bytes);
void sf_queue_destroy(sf_queue *q);

/* Appends item (consumed, also on failure). Returns 0, or SF_ENOMEM when the ring
 * could not grow past its soft bound: the item was freed and the caller must report it. */
int sf_queue_push(sf_queue *q, sf_item *item);
/* 0 with *item, SF_EAGAIN when empty, SF_EOF when empty and every producer closed. */
int sf_queue_pop(sf_queue *q, sf_item *item);
bool sf_queue_can_push(sf_queue *q);
/* Items queued now (takes the lock briefly; for metrics). */
size_t sf_queue_depth(sf_queue *q);
/*
 * Keeps eventfd fd readable exactly while pop would not return SF_EAGAIN
 * (level-triggered, for consumers that poll). fd stays owned by the caller.
 */
void sf_queue_set_notify_fd(sf_queue *q, int fd);
/* One producer is done. */
void sf_queue_close(sf_queue *q);
/* Wakes every waiter (used when the pipeline stops). */
void sf_queue_wake_all(sf_queue *q);

/*
 * Waits until the consumer has something to do (wake_at items, a marker, or
 * closed) or *stop is set, at most timeout seconds (negative = no limit).
 * Returns false on timeout.
 */
bool sf_queue_wait_readable(sf_queue *q, const atomic_bool *stop, double timeout);
/* Waits until can_push() or *stop. */
void sf_queue_wait_writable(sf_queue *q, const atomic_bool *stop);

#endif
