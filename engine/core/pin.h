/* Pinned (page-locked) host memory for batch buffers, through the CUDA runtime loaded at run time. */
#ifndef SF_ENGINE_PIN_H
#define SF_ENGINE_PIN_H

#include <stddef.h>

#include "shardflow/error.h"
#include "shardflow/pool.h"

/*
 * Loads the CUDA runtime (libcudart.so.13, .12, .11, or libcudart.so) with
 * dlopen (dynlib.h, once per process) and checks that it can pin memory on this host (a probe register of
 * one page). Never a build-time dependency. Returns 0, or SF_EUNSUPPORTED with
 * *error saying what is missing (the library, a GPU, a driver) and what to do.
 */
int sf_pin_open(sf_error *error);

/* sf_pool_pin (include/shardflow/pool.h) opens it and marks a pool's buffers pinned. */

/* For pool.c: pin / unpin one allocation (no-ops when sf_pin_open has not succeeded). */
int sf_pin(void *ptr, size_t size);
void sf_unpin(void *ptr);

#endif
