/* NumPy .npy files: written (format 1.0) for the device sink's debug dumps, read (1.0-3.0) by decode. */
#ifndef SF_ENGINE_NPY_H
#define SF_ENGINE_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shardflow/codec.h"
#include "shardflow/error.h"
#include "shardflow/tensor.h"

/* What a .npy header says (spec: numpy.lib.format, NEP 1). */
typedef struct sf_npy_header {
  char descr[16]; /* numpy's descriptor, e.g. "<f4" */
  sf_dtype dtype; /* the sf_dtype it maps to */
  int ndim;
  int64_t shape[SF_TENSOR_MAX_DIMS];
  bool fortran_order; /* data is column-major */
  size_t data_offset; /* bytes from the start of the file to the first element */
  size_t nbytes;      /* bytes of array data (numel * element size) */
} sf_npy_header;

/*
 * Parses the preamble and header dict of the .npy bytes p[0, n) (format versions 1.0, 2.0 and
 * 3.0) into *h, and checks the data (nbytes) fits in n. dtypes: '|u1'/'<u1' uint8, '<u2' uint16,
 * '<i4' int32, '<i8' int64, '<f4' float32; big-endian, other dtypes, structured dtypes and more than
 * SF_TENSOR_MAX_DIMS dimensions are refused. Returns 0; SF_EFORMAT for a corrupt or truncated
 * file; SF_EUNSUPPORTED (the message names the dtype or version). *error carries no URL or key.
 */
int sf_npy_parse_header(const uint8_t *p, size_t n, sf_npy_header *h, sf_error *error);

/* sf_npy_read and sf_npy_write (a .npy into a tensor and back) are public: include/shardflow/codec.h. */

#endif
