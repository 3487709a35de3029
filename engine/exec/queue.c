/* Bounded queues between nodes: mutex + condition variables, woken in runs (see queue.h). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "queue.h"

int sf_queue_init(sf_queue *q, size_t capacity, size_t wake_at, int producers) {
  memset(q, 0, sizeof *q);
  q->capacity = capacity < 1 ? 1 : capacity;
  q->wake_at = wake_at < 1 ? 1 : (wake_at > q->capacity ? q->capacity : wake_at);
  q->cap_alloc = q->capacity + 16 < 4096 ? q->capacity + 16 : 4096; /* grows on demand */
  q->ring = calloc(q->cap_alloc, sizeof *q->ring);
  if (!q->ring) return SF_ENOMEM;
  q->producers = producers;
  q->max_bytes = SIZE_MAX;
  q->notify_fd = -1;
  pthread_mutex_init(&q->lock, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&q->readable, &attr);
  pthread_cond_init(&q->writable, &attr);
  pthread_condattr_destroy(&attr);
  return 0;
}

void sf_queue_set_max_bytes(sf_queue *q, size_t max_bytes) { q->max_bytes = max_bytes ? max_bytes : SIZE_MAX; }

/* Room for another item (lock held): under both bounds, and an empty queue always has room. */
static bool has_room(const sf_queue *q) { return q->count == 0 || (q->count < q->capacity && q->bytes < q->max_bytes); }

void sf_queue_destroy(sf_queue *q) {
  if (!q->ring) return;
  for (size_t i = 0; i < q->count; i++) sf_item_clear(&q->ring[(q->head + i) % q->cap_alloc].item);
  free(q->ring);
  q->ring = NULL;
  pthread_mutex_destroy(&q->lock);
  pthread_cond_destroy(&q->readable);
  pthread_cond_destroy(&q->writable);
}

/* Brings the eventfd's state in line with the queue's (lock held). */
static void update_fd(sf_queue *q) {
  if (q->notify_fd < 0) return;
  bool ready = q->count > 0 || q->producers <= 0;
  if (ready == q->fd_ready) return;
  uint64_t v = 1;
  ssize_t n = ready ? write(q->notify_fd, &v, sizeof v) : read(q->notify_fd, &v, sizeof v);
  (void)n; /* an eventfd counter cannot overflow here (it holds 0 or 1) */
  q->fd_ready = ready;
}

void sf_queue_set_notify_fd(sf_queue *q, int fd) {
  pthread_mutex_lock(&q->lock);
  q->notify_fd = fd;
  q->fd_ready = false;
  update_fd(q);
  pthread_mutex_unlock(&q->lock);
}

static bool grow(sf_queue *q) {
  size_t n = q->cap_alloc * 2;
  sf_queue_slot *ring = malloc(n * sizeof *ring);
  if (!ring) return false;
  for (size_t i = 0; i < q->count; i++) ring[i] = q->ring[(q->head + i) % q->cap_alloc];
  free(q->ring);
  q->ring = ring;
  q->cap_alloc = n;
  q->head = 0;
  return true;
}

int sf_queue_push(sf_queue *q, sf_item *item) {
  size_t bytes = sf_item_nbytes(item);
  pthread_mutex_lock(&q->lock);
  if (q->count == q->cap_alloc && !grow(q)) {
    pthread_mutex_unlock(&q->lock);
    sf_item_clear(item);
    return SF_ENOMEM;
  }
  q->ring[(q->head + q->count) % q->cap_alloc] = (sf_queue_slot){*item, bytes};
  q->count++;
  q->bytes += bytes;
  update_fd(q);
  bool wake = q->consumer_waiting && (q->count >= q->wake_at || !has_room(q) || item->kind == SF_ITEM_EPOCH_END ||
                                      item->kind == SF_ITEM_BATCH);
  if (wake) {
    q->consumer_waiting = false;
    pthread_cond_signal(&q->readable);
  }
  pthread_mutex_unlock(&q->lock);
  item->kind = SF_ITEM_NONE;
  return 0;
}

int sf_queue_pop(sf_queue *q, sf_item *item) {
  pthread_mutex_lock(&q->lock);
  if (q->count == 0) {
    int r = q->producers <= 0 ? SF_EOF : SF_EAGAIN;
    pthread_mutex_unlock(&q->lock);
    return r;
  }
  *item = q->ring[q->head].item;
  size_t bytes = q->ring[q->head].bytes;
  q->head = (q->head + 1) % q->cap_alloc;
  q->count--;
  q->bytes = bytes < q->bytes ? q->bytes - bytes : 0;
  update_fd(q);
  /* Producers wake once the queue is half empty, in items and in bytes (or down to one huge item). */
  if (q->producers_waiting && q->count <= q->capacity / 2 && (q->bytes <= q->max_bytes / 2 || q->count <= 1))
    pthread_cond_broadcast(&q->writable);
  pthread_mutex_unlock(&q->lock);
  return 0;
}

size_t sf_queue_depth(sf_queue *q) {
  pthread_mutex_lock(&q->lock);
  size_t n = q->count;
  pthread_mutex_unlock(&q->lock);
  return n;
}

bool sf_queue_can_push(sf_queue *q) {
  pthread_mutex_lock(&q->lock);
  bool ok = has_room(q);
  pthread_mutex_unlock(&q->lock);
  return ok;
}

void sf_queue_close(sf_queue *q) {
  pthread_mutex_lock(&q->lock);
  q->producers--;
  update_fd(q);
  pthread_cond_broadcast(&q->readable);
  pthread_mutex_unlock(&q->lock);
}

void sf_queue_wake_all(sf_queue *q) {
  pthread_mutex_lock(&q->lock);
  pthread_cond_broadcast(&q->readable);
  pthread_cond_broadcast(&q->writable);
  pthread_mutex_unlock(&q->lock);
}

static bool has_marker(const sf_queue *q) {
  for (size_t i = 0; i < q->count; i++) {
    sf_item_kind k = q->ring[(q->head + i) % q->cap_alloc].item.kind;
    if (k == SF_ITEM_EPOCH_END || k == SF_ITEM_BATCH) return true;
  }
  return false;
}

static void deadline_after(struct timespec *ts, double seconds) {
  clock_gettime(CLOCK_MONOTONIC, ts);
  double whole = (double)(long long)seconds;
  ts->tv_sec += (time_t)whole;
  ts->tv_nsec += (long)((seconds - whole) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

bool sf_queue_wait_readable(sf_queue *q, const atomic_bool *stop, double timeout) {
  struct timespec deadline;
  if (timeout >= 0) deadline_after(&deadline, timeout);
  bool ok = true;
  pthread_mutex_lock(&q->lock);
  while (!atomic_load(stop) && q->producers > 0 && q->count < q->wake_at && has_room(q) && !has_marker(q)) {
    q->consumer_waiting = true;
    if (timeout < 0) {
      pthread_cond_wait(&q->readable, &q->lock);
    } else if (pthread_cond_timedwait(&q->readable, &q->lock, &deadline) == ETIMEDOUT) {
      ok = q->count > 0;
      break;
    }
  }
  q->consumer_waiting = false;
  pthread_mutex_unlock(&q->lock);
  return ok;
}

void sf_queue_wait_writable(sf_queue *q, const atomic_bool *stop) {
  pthread_mutex_lock(&q->lock);
  while (!atomic_load(stop) && !has_room(q)) {
    q->producers_waiting++;
    pthread_cond_wait(&q->writable, &q->lock);
    q->producers_waiting--;
  }
  pthread_mutex_unlock(&q->lock);
}
