/* Refcounted buffers: one allocation for header and data, atomic refcount. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_device.h"
#include "buffer_file.h"
#include "buffer_freer.h"
#include "shardflow/buffer.h"

struct sf_buffer {
  atomic_size_t refs;
  uint8_t *data;
  size_t size;
  sf_buffer_free_fn free_fn;
  void *opaque;
  bool file; /* maps a file (buffer_file.h) */
  const sf_buffer_device *device; /* accelerator memory (buffer_device.h), NULL for host memory */
  /* sf_buffer_new's data follows the 64-byte header (16-byte aligned, as malloc's) */
};

enum { HEADER_SIZE = 64 };
_Static_assert(sizeof(struct sf_buffer) <= HEADER_SIZE, "sf_buffer header must fit in 64 bytes");

sf_buffer *sf_buffer_new(size_t size) {
  if (size > SIZE_MAX - HEADER_SIZE) return NULL;
  sf_buffer *b = malloc(HEADER_SIZE + size);
  if (!b) return NULL;
  atomic_init(&b->refs, 1);
  b->data = (uint8_t *)b + HEADER_SIZE;
  b->size = size;
  b->free_fn = NULL;
  b->opaque = NULL;
  b->file = false;
  b->device = NULL;
  return b;
}

sf_buffer *sf_buffer_wrap(uint8_t *data, size_t size, sf_buffer_free_fn free_fn, void *opaque) {
  sf_buffer *b = malloc(sizeof *b);
  if (!b) return NULL;
  atomic_init(&b->refs, 1);
  b->data = data;
  b->size = size;
  b->free_fn = free_fn;
  b->opaque = opaque;
  b->file = false;
  b->device = NULL;
  return b;
}

sf_buffer *sf_buffer_wrap_device(uint8_t *data, size_t size, sf_buffer_free_fn free_fn, void *opaque,
                                 const sf_buffer_device *device) {
  sf_buffer *b = sf_buffer_wrap(data, size, free_fn, opaque);
  if (b) b->device = device;
  return b;
}

const sf_buffer_device *sf_buffer_device_of(const sf_buffer *b, void **opaque) {
  if (opaque) *opaque = b && b->device ? b->opaque : NULL;
  return b ? b->device : NULL;
}

sf_buffer *sf_buffer_wrap_file(uint8_t *data, size_t size, sf_buffer_free_fn free_fn, void *opaque) {
  sf_buffer *b = sf_buffer_wrap(data, size, free_fn, opaque);
  if (b) b->file = true;
  return b;
}

bool sf_buffer_is_file(const sf_buffer *b) { return b && b->file; }

sf_buffer_free_fn sf_buffer_freer(const sf_buffer *b, void **opaque) {
  *opaque = b ? b->opaque : NULL;
  return b ? b->free_fn : NULL;
}

sf_buffer *sf_buffer_ref(sf_buffer *b) {
  if (b) atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
  return b;
}

void sf_buffer_unref(sf_buffer **pb) {
  if (!pb || !*pb) return;
  sf_buffer *b = *pb;
  *pb = NULL;
  if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1) return;
  if (b->free_fn) b->free_fn(b->opaque, b->data); /* wrapped memory; sf_buffer_new's has none */
  free(b);
}

uint8_t *sf_buffer_data(const sf_buffer *b) { return b ? b->data : NULL; }

size_t sf_buffer_size(const sf_buffer *b) { return b ? b->size : 0; }

bool sf_buffer_is_writable(const sf_buffer *b) {
  return b && atomic_load_explicit(&((sf_buffer *)b)->refs, memory_order_acquire) == 1;
}

int sf_buffer_set_size(sf_buffer *b, size_t size) {
  if (!b || size > b->size) return SF_EINVAL;
  b->size = size;
  return 0;
}
