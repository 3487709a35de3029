/* Decoded images' buffers from a process-wide pool, so that decoding does not page-fault fresh memory. */
#ifndef SF_ENGINE_PIXELS_H
#define SF_ENGINE_PIXELS_H

#include <stdint.h>

#include "shardflow/tensor.h"

/*
 * Makes *out a contiguous [h, w, c] tensor of dtype (contents undefined) whose buffer comes from
 * a process-wide pool (shardflow/pool.h) of buffers in 64 KiB size classes up to 1 MiB (a
 * 500x500 RGB image is 732 KiB); larger images get a plain allocation. The buffer may be larger
 * than the tensor. It returns to the pool when its last reference goes, from any thread; the
 * pool keeps at most 96 idle buffers (96 MiB at most, about 50 MiB for ImageNet-sized photos).
 * A fresh multi-hundred-KB buffer costs a page fault per 4 KiB: perf showed them in decode.
 * Returns 0, SF_EINVAL for a bad shape or SF_ENOMEM (*out is then zeroed).
 */
int sf_pixels_alloc(sf_tensor *out, sf_dtype dtype, int64_t h, int64_t w, int64_t c);

#endif
