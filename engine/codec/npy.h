/* NumPy .npy files (format version 1.0) for the device sink's debug dumps. */
#ifndef SF_ENGINE_NPY_H
#define SF_ENGINE_NPY_H

#include "shardflow/error.h"
#include "shardflow/tensor.h"

/*
 * Writes tensor to path as .npy v1.0 (little-endian descriptor '<f4', '|u1',
 * '<i8', '<i4'; bfloat16 is written as '<u2' raw bits). Non-contiguous
 * tensors are written in logical C order. Returns 0, SF_EIO or SF_EUNSUPPORTED
 * with *error naming the path. Spec: numpy.lib.format (NEP 1).
 */
int sf_npy_write(const char *path, const sf_tensor *tensor, sf_error *error);

#endif
