/* Tensors: strided views of refcounted buffers. */
#include <stddef.h>
#include <string.h>

#include "shardflow/tensor.h"

static const struct {
  const char *name;
  size_t size;
} dtypes[SF_DTYPE_COUNT_] = {
    [SF_DTYPE_UINT8] = {"uint8", 1},     [SF_DTYPE_INT32] = {"int32", 4},
    [SF_DTYPE_INT64] = {"int64", 8},     [SF_DTYPE_FLOAT32] = {"float32", 4},
    [SF_DTYPE_BFLOAT16] = {"bfloat16", 2}, [SF_DTYPE_UINT16] = {"uint16", 2},
    [SF_DTYPE_FLOAT64] = {"float64", 8},
};

size_t sf_dtype_size(sf_dtype d) { return (unsigned)d < SF_DTYPE_COUNT_ ? dtypes[d].size : 0; }

const char *sf_dtype_name(sf_dtype d) { return (unsigned)d < SF_DTYPE_COUNT_ ? dtypes[d].name : "?"; }

int64_t sf_tensor_numel(const sf_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

size_t sf_tensor_nbytes(const sf_tensor *t) { return (size_t)sf_tensor_numel(t) * sf_dtype_size(t->dtype); }

bool sf_tensor_is_contiguous(const sf_tensor *t) {
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != expect) return false;
    expect *= t->shape[i];
  }
  return true;
}

int sf_tensor_set_shape(sf_tensor *t, sf_dtype dtype, int ndim, const int64_t *shape) {
  memset(t, 0, sizeof *t);
  if (ndim < 0 || ndim > SF_TENSOR_MAX_DIMS || (unsigned)dtype >= SF_DTYPE_COUNT_) return SF_EINVAL;
  t->dtype = dtype;
  t->ndim = ndim;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    if (shape[i] < 0 || (shape[i] > 0 && stride > INT64_MAX / shape[i])) {
      memset(t, 0, sizeof *t);
      return SF_EINVAL;
    }
    t->shape[i] = shape[i];
    t->strides[i] = stride;
    stride *= shape[i];
  }
  if (stride > INT64_MAX / (int64_t)sf_dtype_size(dtype)) { /* the byte count must fit too */
    memset(t, 0, sizeof *t);
    return SF_EINVAL;
  }
  return 0;
}

int sf_tensor_view(sf_tensor *t, sf_dtype dtype, int ndim, const int64_t *shape, sf_buffer *buffer,
                   size_t offset) {
  int r = sf_tensor_set_shape(t, dtype, ndim, shape);
  if (r == 0 && (offset > sf_buffer_size(buffer) || sf_tensor_nbytes(t) > sf_buffer_size(buffer) - offset))
    r = SF_ETOOBIG;
  if (r < 0) {
    sf_buffer_unref(&buffer);
    memset(t, 0, sizeof *t);
    return r;
  }
  t->buffer = buffer;
  t->offset = offset;
  return 0;
}

int sf_tensor_alloc(sf_tensor *t, sf_dtype dtype, int ndim, const int64_t *shape) {
  int r = sf_tensor_set_shape(t, dtype, ndim, shape);
  if (r < 0) return r;
  t->buffer = sf_buffer_new(sf_tensor_nbytes(t));
  if (!t->buffer) {
    memset(t, 0, sizeof *t);
    return SF_ENOMEM;
  }
  return 0;
}

void *sf_tensor_data(const sf_tensor *t) {
  return t->buffer ? sf_buffer_data(t->buffer) + t->offset : NULL;
}

void sf_tensor_ref(sf_tensor *dst, const sf_tensor *src) {
  *dst = *src;
  sf_buffer_ref(dst->buffer);
}

void sf_tensor_clear(sf_tensor *t) {
  sf_buffer_unref(&t->buffer);
  memset(t, 0, sizeof *t);
}

void sf_tensor_copy_to(const sf_tensor *src, void *dst_) {
  uint8_t *dst = dst_;
  size_t esize = sf_dtype_size(src->dtype);
  const uint8_t *base = sf_tensor_data(src);
  if (sf_tensor_is_contiguous(src)) {
    memcpy(dst, base, sf_tensor_nbytes(src));
    return;
  }
  int64_t numel = sf_tensor_numel(src);
  int64_t idx[SF_TENSOR_MAX_DIMS] = {0};
  int last = src->ndim - 1;
  for (int64_t n = 0; n < numel; n++) {
    ptrdiff_t off = 0;
    for (int d = 0; d <= last; d++) off += (ptrdiff_t)(idx[d] * src->strides[d]);
    memcpy(dst, base + off * (ptrdiff_t)esize, esize);
    dst += esize;
    for (int d = last; d >= 0 && ++idx[d] == src->shape[d]; d--) idx[d] = 0;
  }
}
