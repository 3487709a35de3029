/*
 * A shared-memory ring between a head and one local worker process it started: the worker writes RESULT
 * tensors into it, the socket carries only their positions, and the head's fields are views of it.
 * engine/group/shm_ring.c has the design; docs/protocol.md the messages.  Contract header.
 */
#ifndef SF_ENGINE_SHM_RING_H
#define SF_ENGINE_SHM_RING_H

#include <stddef.h>
#include <stdint.h>

#include "shardflow/buffer.h"
#include "shardflow/error.h"

/* Payloads smaller than this go over the socket even with a ring (a label: not worth an extent). */
enum { SF_SHM_MIN_BYTES = 256 };

/* One ring, as the head or the worker maps it.  Refcounted on the head (views keep it mapped). */
typedef struct sf_shm_ring sf_shm_ring;

/*
 * Head: creates a ring of size bytes (rounded up to whole pages): a sealed memfd (it can neither shrink nor
 * grow, so a worker cannot make the head's mapping fault) mapped read-only here.  *fd is the memfd, opened
 * close-on-exec, for the worker process to inherit (posix_spawn_file_actions_adddup2(fd, fd) clears that in
 * the child); the caller closes it once the worker is started.  Returns 0 and a ring with one reference, or
 * SF_ENOMEM / SF_EIO (memfd_create, ftruncate or mmap failed; *error says which).
 */
int sf_shm_ring_new(size_t size, sf_shm_ring **ring, int *fd, sf_error *error);

/*
 * Worker: maps the ring the head passed as fd (`shardflow worker --shm-fd N`) read-write and closes fd.
 * Returns 0 and the worker's ring, SF_EINVAL (fd is not a sealed memfd of at least one page: not started by a
 * head) or SF_EIO (mmap failed).
 */
int sf_shm_ring_attach(int fd, sf_shm_ring **ring, sf_error *error);

/* Adds a reference (head side; any thread).  Returns ring. */
sf_shm_ring *sf_shm_ring_ref(sf_shm_ring *ring);

/* Drops the reference *ring (NULL-safe) and sets it NULL; the last one unmaps it. */
void sf_shm_ring_unref(sf_shm_ring **ring);

/* Bytes of the ring. */
size_t sf_shm_ring_size(const sf_shm_ring *ring);

/*
 * Worker: reserves length contiguous bytes after the last reservation (64-byte aligned), skipping the end of
 * the ring when they would wrap.  Positions count bytes ever reserved (offset in the ring = position % size), so the head can
 * check them.  Returns where to write (and *position), or NULL when the ring has no room until the head frees
 * more (the caller sends over the socket instead: never waits).  One thread per ring.
 */
uint8_t *sf_shm_ring_reserve(sf_shm_ring *ring, size_t length, uint64_t *position);

/* Worker: the position of the next reservation, for sf_shm_ring_rollback. */
uint64_t sf_shm_ring_mark(const sf_shm_ring *ring);

/* Worker: takes back every reservation made since mark (their message was never sent). */
void sf_shm_ring_rollback(sf_shm_ring *ring, uint64_t mark);

/* Worker: everything before position is free again (the head's shm_freed; older values are ignored). */
void sf_shm_ring_set_freed(sf_shm_ring *ring, uint64_t position);

/*
 * Head: a buffer viewing the extent [position, position + length) the worker wrote (borrowed memory; the
 * extent stays reserved until the last reference to the buffer goes, on any thread).  Extents must come in
 * the order the worker reserved them, without wrapping, and never over an extent still in use.  Returns 0
 * and a new buffer (caller owns it), SF_EFORMAT (an extent that breaks those rules: *error says which) or
 * SF_ENOMEM.
 */
int sf_shm_ring_view(sf_shm_ring *ring, uint64_t position, uint64_t length, sf_buffer **view, sf_error *error);

/* Head: the position before which every extent has been released (sent to the worker as shm_freed). */
uint64_t sf_shm_ring_freed(sf_shm_ring *ring);

#endif
