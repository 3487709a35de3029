/*
 * Buffers of accelerator memory (the device sink's batches on a GPU, engine/core/device.c): their data
 * pointer is a device address, never read on the host, and the DLPack export (dlpack.c) asks the memory's
 * owner to order the consumer's stream after the copy. Engine-internal.
 */
#ifndef SF_BUFFER_DEVICE_H
#define SF_BUFFER_DEVICE_H

#include <stdint.h>

#include "shardflow/buffer.h"

/* Where a buffer's memory lives and what its owner does when a consumer takes it; static, shared by buffers. */
typedef struct sf_buffer_device {
  int type; /* DLPack's DLDeviceType (kDLCUDA = 2) */
  int id;   /* the device's ordinal */
  /* The trainer took the buffer (a DLPack export began): any thread; opaque is the buffer's. */
  void (*exported)(void *opaque);
  /*
   * Makes the consumer's stream (DLPack's __dlpack__ stream: 1 the legacy default stream, 2 the
   * per-thread one, else a CUstream) wait until the data is there, and remembers it so that the
   * memory is reused only after the work queued there before the release. -1: no ordering (the
   * consumer synchronises itself). Returns 0 or a negative SF_E* code. Any thread.
   */
  int (*wait)(void *opaque, int64_t stream);
} sf_buffer_device;

/* sf_buffer_wrap() of device memory: the same, and sf_buffer_device_of() returns device (borrowed, static). */
sf_buffer *sf_buffer_wrap_device(uint8_t *data, size_t size, sf_buffer_free_fn free_fn, void *opaque,
                                 const sf_buffer_device *device);

/*
 * The device of a buffer made by sf_buffer_wrap_device(), with its free callback's opaque in *opaque
 * (may be NULL); NULL (and *opaque NULL) for host memory and for NULL.
 */
const sf_buffer_device *sf_buffer_device_of(const sf_buffer *buffer, void **opaque);

#endif
