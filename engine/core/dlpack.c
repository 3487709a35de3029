/* DLPack export of batch fields: a managed tensor holding a buffer reference, freed by its deleter. */
#include <stdlib.h>

#include "buffer_device.h"
#include "shardflow/dlpack.h"

typedef struct managed {
  DLManagedTensor tensor;
  int64_t shape[SF_TENSOR_MAX_DIMS];
  int64_t strides[SF_TENSOR_MAX_DIMS];
  sf_buffer *buffer;
} managed;

static void release(DLManagedTensor *self) {
  managed *m = self->manager_ctx;
  sf_buffer_unref(&m->buffer);
  free(m);
}

static bool dl_type(sf_dtype dtype, DLDataType *out) {
  static const DLDataType types[SF_DTYPE_COUNT_] = {
      [SF_DTYPE_UINT8] = {kDLUInt, 8, 1},     [SF_DTYPE_INT32] = {kDLInt, 32, 1},
      [SF_DTYPE_INT64] = {kDLInt, 64, 1},     [SF_DTYPE_FLOAT32] = {kDLFloat, 32, 1},
      [SF_DTYPE_BFLOAT16] = {kDLBfloat, 16, 1}, [SF_DTYPE_UINT16] = {kDLUInt, 16, 1},
      [SF_DTYPE_FLOAT64] = {kDLFloat, 64, 1},
  };
  if ((unsigned)dtype >= SF_DTYPE_COUNT_) return false;
  *out = types[dtype];
  return true;
}

int sf_batch_to_dlpack(const sf_batch *batch, int i, DLManagedTensor **out) {
  *out = NULL;
  if (!batch || i < 0 || i >= batch->n_fields) return SF_EINVAL;
  const sf_tensor *t = &batch->fields[i].tensor;
  DLDataType type;
  if (!t->buffer || !dl_type(t->dtype, &type)) return SF_EINVAL;
  managed *m = calloc(1, sizeof *m);
  if (!m) return SF_ENOMEM;
  for (int d = 0; d < t->ndim; d++) {
    m->shape[d] = t->shape[d];
    m->strides[d] = t->strides[d];
  }
  void *owner;
  const sf_buffer_device *device = sf_buffer_device_of(t->buffer, &owner);
  m->buffer = sf_buffer_ref(t->buffer);
  if (device) device->exported(owner); /* the trainer took the batch: the device sink may copy the next */
  m->tensor.dl_tensor = (DLTensor){
      .data = sf_buffer_data(t->buffer),
      .device = device ? (DLDevice){(DLDeviceType)device->type, device->id} : (DLDevice){kDLCPU, 0},
      .ndim = t->ndim,
      .dtype = type,
      .shape = m->shape,
      .strides = m->strides,
      .byte_offset = t->offset,
  };
  m->tensor.manager_ctx = m;
  m->tensor.deleter = release;
  *out = &m->tensor;
  return 0;
}

int sf_dlpack_wait(DLManagedTensor *t, int64_t stream) {
  if (!t) return SF_EINVAL;
  if (t->deleter != release) return 0; /* not ours: nothing of ours to wait for */
  void *owner;
  const sf_buffer_device *device = sf_buffer_device_of(((managed *)t->manager_ctx)->buffer, &owner);
  return device ? device->wait(owner, stream) : 0;
}

void sf_dlpack_release(DLManagedTensor *t) {
  if (t && t->deleter) t->deleter(t);
}
