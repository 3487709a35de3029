/* shardflow tensors: dtype, shape, strides and a refcounted buffer (the DLPack model). */
#ifndef SHARDFLOW_TENSOR_H
#define SHARDFLOW_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shardflow/buffer.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Element types.  bfloat16 is the upper half of an IEEE float32. */
typedef enum sf_dtype {
  SF_DTYPE_UINT8 = 0,
  SF_DTYPE_INT32,
  SF_DTYPE_INT64,
  SF_DTYPE_FLOAT32,
  SF_DTYPE_BFLOAT16,
  SF_DTYPE_UINT16,  /**< 16-bit images (PNG, PGM) and .npy '<u2' */
  SF_DTYPE_FLOAT64, /**< timestamps in seconds (the video plugin's FIELD.pts); device_sink writes it as .npy '<f8' */
  SF_DTYPE_COUNT_ /**< number of dtypes, not a dtype */
} sf_dtype;

/** Most dimensions a tensor may have. */
#define SF_TENSOR_MAX_DIMS 6

/**
 * A strided view of a buffer.  shape and strides count elements (as in
 * DLPack), offset counts bytes from the start of the buffer.  A tensor holds
 * one reference to its buffer; copying the struct by value does not add one
 * (use sf_tensor_ref).  A zeroed struct is an empty tensor (no buffer).
 */
typedef struct sf_tensor {
  sf_dtype dtype;
  int ndim;                               /**< 0 for a scalar */
  int64_t shape[SF_TENSOR_MAX_DIMS];
  int64_t strides[SF_TENSOR_MAX_DIMS];    /**< in elements */
  size_t offset;                          /**< bytes from sf_buffer_data(buffer) */
  sf_buffer *buffer;                      /**< owned reference, or NULL */
} sf_tensor;

/** Size of one element in bytes (bfloat16: 2). Returns 0 for an unknown dtype. */
SF_API size_t sf_dtype_size(sf_dtype dtype);

/** Lower-case name ("uint8", "float32", "bfloat16"...); "?" for an unknown dtype. */
SF_API const char *sf_dtype_name(sf_dtype dtype);

/** Number of elements (product of the shape; 1 for a scalar). */
SF_API int64_t sf_tensor_numel(const sf_tensor *tensor);

/** Bytes covered by a contiguous tensor of this shape: numel * dtype size. */
SF_API size_t sf_tensor_nbytes(const sf_tensor *tensor);

/** True when strides are the row-major (C order) strides of the shape. */
SF_API bool sf_tensor_is_contiguous(const sf_tensor *tensor);

/**
 * Sets dtype, shape and the contiguous row-major strides of *tensor, with no
 * buffer (offset 0): the header of a tensor whose memory comes later.
 * Returns 0, or SF_EINVAL when ndim or the dtype is out of range, a dimension
 * is negative, or the element count overflows.  *tensor is zeroed on failure.
 */
SF_API int sf_tensor_set_shape(sf_tensor *tensor, sf_dtype dtype, int ndim, const int64_t *shape);

/**
 * Makes *tensor a contiguous row-major view of buffer at byte offset, taking
 * over the caller's reference to buffer (transfer full).
 * Returns 0; SF_EINVAL when ndim or the dtype is out of range, a dimension is
 * negative or the byte count overflows; SF_ETOOBIG when offset + nbytes
 * exceeds the buffer.  On every failure the reference is dropped and *tensor
 * zeroed.
 */
SF_API int sf_tensor_view(sf_tensor *tensor, sf_dtype dtype, int ndim, const int64_t *shape,
                          sf_buffer *buffer, size_t offset);

/**
 * Allocates a fresh contiguous tensor (uninitialised contents).
 * Returns 0, SF_EINVAL for a bad shape, SF_ENOMEM when out of memory.
 * The caller owns the tensor and releases it with sf_tensor_clear().
 */
SF_API int sf_tensor_alloc(sf_tensor *tensor, sf_dtype dtype, int ndim, const int64_t *shape);

/**
 * Copies the tensor's elements in logical C order (row-major over shape) into
 * dst, which must hold sf_tensor_nbytes(tensor) bytes: one memcpy when the
 * tensor is contiguous, element by element through the strides otherwise.
 */
SF_API void sf_tensor_copy_to(const sf_tensor *tensor, void *dst);

/** Pointer to the first element (borrowed). NULL for an empty tensor. */
SF_API void *sf_tensor_data(const sf_tensor *tensor);

/** Copies the view and adds a reference to the buffer: *dst owns one reference. */
SF_API void sf_tensor_ref(sf_tensor *dst, const sf_tensor *src);

/** Drops the buffer reference and zeroes *tensor. Safe on a zeroed tensor. */
SF_API void sf_tensor_clear(sf_tensor *tensor);

#ifdef __cplusplus
}
#endif
#endif
