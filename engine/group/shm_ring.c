/*
 * Shared-memory rings: a group's local worker processes hand their results to the head without copies
 * through the socket.
 *
 * The head creates one memfd per local worker process it starts (sealed: it can neither shrink nor grow),
 * maps it, and lets the child inherit it (`shardflow worker --shm-fd N`).  A worker the head did not start
 * has no ring and sends everything over the socket, as before.  The worker writes each RESULT payload
 * (SF_SHM_MIN_BYTES or more) into the next free extent of the ring — augment's deferred fields are written
 * there by their recipe, so that is the only write — and the RESULT header names the extent (position,
 * length) in place of a payload frame.  The head checks the extent and hands the sample a view of it; the
 * extent is released when the last reference to the view goes (the batch copied it, a duplicate was
 * dropped), on whatever thread that is.
 *
 * Positions count bytes ever reserved (offset = position % size), so both sides agree on order without
 * sharing any state in the memory itself: the worker reserves extents one after another, skipping the tail
 * of the ring rather than wrapping an extent; the head sees them in the same order (one socket), releases
 * them in any order, and tells the worker `shm_freed`, the position before which everything is released,
 * in its next UNIT or HEARTBEAT.  A worker without room sends that payload over the socket: it never waits,
 * and nothing is lost.  The shared memory holds only tensor bytes, never bookkeeping, so a worker killed
 * mid-write leaves at worst a half-written extent that no header ever named; the head's mapping (and every
 * view of it) stays valid until its last reference goes, and a restarted worker gets a fresh ring.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm_ring.h"

typedef struct extent {
  uint64_t position, end;
  bool released;
} extent;

struct sf_shm_ring {
  atomic_int refs;
  uint8_t *base;
  size_t size;
  /* worker: reservations */
  uint64_t next, freed;
  /* head: extents given out as views, oldest first (ext[first .. first+count)) */
  pthread_mutex_t lock;
  extent *ext;
  size_t first, count, cap;
  uint64_t last_end, released_to;
};

static int ring_map(int fd, size_t size, sf_shm_ring **out, sf_error *error) {
  sf_shm_ring *r = calloc(1, sizeof *r);
  if (!r) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "shared-memory ring: out of memory");
  /* populated now: its pages are resident from the start (a steady RSS, no page faults while running) */
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    int e = errno;
    free(r);
    return sf_error_set(error, SF_EIO, SF_NOWHERE, "shared-memory ring: cannot map %zu bytes: %s", size, strerror(e));
  }
  atomic_init(&r->refs, 1);
  r->base = base;
  r->size = size;
  pthread_mutex_init(&r->lock, NULL);
  *out = r;
  return 0;
}

int sf_shm_ring_new(size_t size, sf_shm_ring **ring, int *fd, sf_error *error) {
  *ring = NULL;
  *fd = -1;
  long page = sysconf(_SC_PAGESIZE);
  size = (size + (size_t)page - 1) / (size_t)page * (size_t)page;
  int f = memfd_create("shardflow-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (f < 0)
    return sf_error_set(error, SF_EIO, SF_NOWHERE, "shared-memory ring: memfd_create failed: %s", strerror(errno));
  if (ftruncate(f, (off_t)size) != 0 || fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int e = errno;
    close(f);
    return sf_error_set(error, SF_EIO, SF_NOWHERE, "shared-memory ring: cannot size a memfd to %zu bytes: %s", size,
                        strerror(e));
  }
  int rc = ring_map(f, size, ring, error);
  if (rc < 0) {
    close(f);
    return rc;
  }
  *fd = f;
  return 0;
}

int sf_shm_ring_attach(int fd, sf_shm_ring **ring, sf_error *error) {
  *ring = NULL;
  struct stat st;
  int seals = fcntl(fd, F_GET_SEALS);
  if (fstat(fd, &st) != 0 || seals < 0 || !(seals & F_SEAL_SHRINK) || st.st_size < sysconf(_SC_PAGESIZE)) {
    close(fd);
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE,
                        "--shm-fd %d is not a shared-memory ring (a sealed memfd): only a head that starts the "
                        "worker passes it",
                        fd);
  }
  int rc = ring_map(fd, (size_t)st.st_size, ring, error);
  close(fd);
  return rc;
}

sf_shm_ring *sf_shm_ring_ref(sf_shm_ring *ring) {
  atomic_fetch_add(&ring->refs, 1);
  return ring;
}

void sf_shm_ring_unref(sf_shm_ring **ring) {
  sf_shm_ring *r = *ring;
  *ring = NULL;
  if (!r || atomic_fetch_sub(&r->refs, 1) != 1) return;
  munmap(r->base, r->size);
  pthread_mutex_destroy(&r->lock);
  free(r->ext);
  free(r);
}

size_t sf_shm_ring_size(const sf_shm_ring *ring) { return ring->size; }

/* ---- the worker's side ---- */

uint8_t *sf_shm_ring_reserve(sf_shm_ring *ring, size_t length, uint64_t *position) {
  if (length == 0 || length > ring->size) return NULL;
  uint64_t start = (ring->next + 63) & ~(uint64_t)63; /* cache-line aligned: any dtype's loads, no false sharing */
  if (start % ring->size + length > ring->size) start += ring->size - start % ring->size; /* skip the tail */
  if (start + length - ring->freed > ring->size) return NULL;
  ring->next = start + length;
  *position = start;
  return ring->base + start % ring->size;
}

uint64_t sf_shm_ring_mark(const sf_shm_ring *ring) { return ring->next; }

void sf_shm_ring_rollback(sf_shm_ring *ring, uint64_t mark) {
  if (mark < ring->next) ring->next = mark;
}

void sf_shm_ring_set_freed(sf_shm_ring *ring, uint64_t position) {
  if (position > ring->freed && position <= ring->next) ring->freed = position;
}

/* ---- the head's side ---- */

/* sf_buffer free function of a view: releases its extent and drops the view's ring reference. */
static void release_view(void *opaque, uint8_t *data) {
  sf_shm_ring *r = opaque;
  uint64_t offset = (uint64_t)(data - r->base);
  pthread_mutex_lock(&r->lock);
  for (size_t i = 0; i < r->count; i++) {
    extent *x = &r->ext[r->first + i];
    if (!x->released && x->position % r->size == offset) {
      x->released = true;
      break;
    }
  }
  while (r->count > 0 && r->ext[r->first].released) {
    r->released_to = r->ext[r->first].end;
    r->first++;
    r->count--;
  }
  if (r->count == 0) r->first = 0;
  pthread_mutex_unlock(&r->lock);
  sf_shm_ring_unref(&r);
}

int sf_shm_ring_view(sf_shm_ring *ring, uint64_t position, uint64_t length, sf_buffer **view, sf_error *error) {
  *view = NULL;
  sf_shm_ring *r = ring;
  pthread_mutex_lock(&r->lock);
  const char *wrong = NULL;
  if (length == 0 || length > r->size || position > UINT64_MAX - length) wrong = "has a bad length";
  else if (position < r->last_end) wrong = "overlaps or precedes the previous one";
  else if (position % r->size + length > r->size) wrong = "wraps around the ring's end";
  else if (position + length - r->released_to > r->size) wrong = "overwrites an extent still in use";
  if (wrong) {
    pthread_mutex_unlock(&r->lock);
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE,
                        "wire: shared-memory extent at %llu (%llu bytes) %s (ring of %zu bytes, in use from %llu)",
                        (unsigned long long)position, (unsigned long long)length, wrong, r->size,
                        (unsigned long long)r->released_to);
  }
  if (r->first + r->count == r->cap) {
    if (r->first > 0) { /* slide the live extents down before growing */
      memmove(r->ext, r->ext + r->first, r->count * sizeof *r->ext);
      r->first = 0;
    }
    if (r->count == r->cap) {
      size_t cap = r->cap ? r->cap * 2 : 64;
      extent *grown = realloc(r->ext, cap * sizeof *grown);
      if (!grown) {
        pthread_mutex_unlock(&r->lock);
        return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
      }
      r->ext = grown;
      r->cap = cap;
    }
  }
  sf_buffer *b = sf_buffer_wrap(r->base + position % r->size, (size_t)length, release_view, r);
  if (!b) {
    pthread_mutex_unlock(&r->lock);
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory");
  }
  if (r->count == 0) r->released_to = position; /* the skipped tail before it is free too */
  r->ext[r->first + r->count++] = (extent){.position = position, .end = position + length};
  r->last_end = position + length;
  sf_shm_ring_ref(r);
  pthread_mutex_unlock(&r->lock);
  *view = b;
  return 0;
}

uint64_t sf_shm_ring_freed(sf_shm_ring *ring) {
  pthread_mutex_lock(&ring->lock);
  uint64_t v = ring->released_to;
  pthread_mutex_unlock(&ring->lock);
  return v;
}
