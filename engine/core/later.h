/* Memory chores done later on a thread of the process's own (see later.c). */
#ifndef SF_ENGINE_LATER_H
#define SF_ENGINE_LATER_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Runs job(arg) soon on the process's chores thread (started at the first call), after the jobs asked for
 * before it. Returns false, having run nothing, when that thread or the note of the job cannot be made: the
 * caller then does the work itself. A job must not wait for the caller, nor call sf_later.
 */
bool sf_later(void (*job)(void *arg), void *arg);

/*
 * munmap(data, size) on the chores thread, or here and now when sf_later cannot take it. The caller no
 * longer reads the range.
 */
void sf_unmap_later(void *data, size_t size);

#endif
