/* Unmapping a shard's mapping off the thread that drops its last view (see unmapper.c). */
#ifndef SF_ENGINE_UNMAPPER_H
#define SF_ENGINE_UNMAPPER_H

#include <stddef.h>

/*
 * munmap(data, size), soon, on a thread of its own (started at the first call); at once on this thread when
 * that thread or the note of the request cannot be made. The caller no longer reads the range.
 */
void sf_unmap_later(void *data, size_t size);

#endif
