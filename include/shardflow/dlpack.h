/* shardflow batches as DLPack tensors: handed to PyTorch, NumPy or JAX without a copy. */
#ifndef SHARDFLOW_DLPACK_H
#define SHARDFLOW_DLPACK_H

#include <dlpack/dlpack.h>

#include "shardflow/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Exports field i of batch (0 <= i < batch->n_fields) as a DLPack managed
 * tensor (DLPack 0.6, the unversioned DLManagedTensor that NumPy 1.24 and
 * PyTorch take): the batch's device (kDLCPU, or kDLCUDA with the GPU's
 * ordinal when device_sink's `device` is cuda[:N]: see sf_dlpack_wait), the field's dtype (uint8, int32, int64,
 * float32, bfloat16), shape [B, ...] and strides, data pointing at the
 * batch's own buffer (no copy).  The managed tensor holds a reference to that
 * buffer, so it stays valid after the batch and the pipeline are destroyed;
 * calling its deleter drops the reference (the buffer then returns to the
 * batch stage's pool).  Returns 0 with *out (the caller owns it and must call
 * (*out)->deleter(*out) exactly once, or hand it to a consumer that will),
 * SF_EINVAL for a bad index or a field without values (a deferred field),
 * SF_ENOMEM.  Spec: https://dmlc.github.io/dlpack/latest/ (DLPack 0.6).
 */
SF_API int sf_batch_to_dlpack(const sf_batch *batch, int i, DLManagedTensor **out);

/**
 * The DLPack stream protocol for a tensor of sf_batch_to_dlpack() on a GPU:
 * makes the consumer's CUDA stream wait (without blocking the host) until
 * the batch's copy to the device is complete, as `__dlpack__(stream=...)`
 * promises.  stream: 1 for the legacy default stream, 2 for the per-thread
 * default stream, otherwise the CUstream / cudaStream_t handle as an
 * integer; -1 for no ordering (the consumer synchronises by itself).  The
 * stream is also remembered: when the tensor is released its memory is
 * reused only after the work queued on that stream until then.  Call it
 * before the consumer reads the data, with the CUDA context current or not.
 * For a CPU tensor or a tensor not made by shardflow it does nothing.
 * Returns 0, SF_EINVAL for a NULL tensor, or SF_EUNSUPPORTED when the
 * driver refuses (a stream of another device; the message is logged).
 */
SF_API int sf_dlpack_wait(DLManagedTensor *tensor, int64_t stream);

/** Calls tensor->deleter(tensor) (for bindings such as Python's ctypes that cannot call it). NULL-safe. */
SF_API void sf_dlpack_release(DLManagedTensor *tensor);

#ifdef __cplusplus
}
#endif
#endif
