/* NumPy .npy writer (format 1.0) so batches can be inspected with numpy.load(). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "npy.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define ENDIAN ">"
#else
#define ENDIAN "<"
#endif

/* numpy's descriptor strings; bfloat16 has none, so its raw bits go out as uint16. */
static const char *descr(sf_dtype dtype) {
  switch (dtype) {
  case SF_DTYPE_UINT8: return "|u1";
  case SF_DTYPE_INT32: return ENDIAN "i4";
  case SF_DTYPE_INT64: return ENDIAN "i8";
  case SF_DTYPE_FLOAT32: return ENDIAN "f4";
  case SF_DTYPE_BFLOAT16: return ENDIAN "u2";
  default: return NULL;
  }
}

/*
 * Builds the 1.0 preamble + header in out: magic, version, little-endian
 * header length, then the dict padded with spaces and a final '\n' so the
 * data starts at a multiple of 64 bytes (numpy's ARRAY_ALIGN). Returns the
 * total length, or 0 when it would not fit.
 */
static size_t build_header(char *out, size_t cap, const char *d, const sf_tensor *t) {
  char dict[512];
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", d);
  for (int i = 0; i < t->ndim; i++)
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld,%s", (long long)t->shape[i],
                  (i + 1 < t->ndim) ? " " : "");
  /* numpy writes (5,) for one dimension and (2, 3) for more: drop the trailing comma then. */
  if (t->ndim > 1) n--;
  n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
  /* numpy's own rule: 1 to 64 spaces, so an already aligned header still gets 64. */
  size_t total = 10 + (size_t)n + 1;
  total += 64 - total % 64;
  if (total > cap || total - 10 > 65535) return 0;
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  size_t hlen = total - 10;
  out[8] = (char)(hlen & 0xff);
  out[9] = (char)(hlen >> 8);
  memcpy(out + 10, dict, (size_t)n);
  memset(out + 10 + n, ' ', total - 10 - (size_t)n - 1);
  out[total - 1] = '\n';
  return total;
}

/* Writes the elements of dimension `dim` onwards in logical C order. */
static int write_strided(FILE *f, const uint8_t *base, const sf_tensor *t, int dim, size_t esize) {
  if (dim == t->ndim) return fwrite(base, esize, 1, f) == 1 ? 0 : -1;
  int64_t step = t->strides[dim] * (int64_t)esize;
  if (dim == t->ndim - 1 && t->strides[dim] == 1)
    return (size_t)t->shape[dim] == 0 ||
                   fwrite(base, esize, (size_t)t->shape[dim], f) == (size_t)t->shape[dim]
               ? 0
               : -1;
  for (int64_t i = 0; i < t->shape[dim]; i++)
    if (write_strided(f, base + i * step, t, dim + 1, esize) < 0) return -1;
  return 0;
}

int sf_npy_write(const char *path, const sf_tensor *tensor, sf_error *error) {
  const char *d = descr(tensor->dtype);
  if (!d || tensor->ndim < 0 || tensor->ndim > SF_TENSOR_MAX_DIMS)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_AT(.url = path),
                        "cannot write %s tensors with %d dimensions to .npy", sf_dtype_name(tensor->dtype),
                        tensor->ndim);
  int64_t numel = sf_tensor_numel(tensor);
  if (numel > 0 && !tensor->buffer)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_AT(.url = path), "tensor has %lld elements but no buffer",
                        (long long)numel);
  char header[1024];
  size_t hlen = build_header(header, sizeof header, d, tensor);
  if (hlen == 0)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_AT(.url = path), "shape too long for a .npy 1.0 header");

  FILE *f = fopen(path, "wb");
  if (!f)
    return sf_error_set(error, SF_EIO, SF_AT(.url = path),
                        "cannot create %s: %s (check the directory exists and is writable)", path, strerror(errno));
  int r = fwrite(header, 1, hlen, f) == hlen ? 0 : -1;
  if (r == 0 && numel > 0) {
    const uint8_t *base = sf_tensor_data(tensor);
    size_t esize = sf_dtype_size(tensor->dtype);
    if (sf_tensor_is_contiguous(tensor))
      r = fwrite(base, esize, (size_t)numel, f) == (size_t)numel ? 0 : -1;
    else
      r = write_strided(f, base, tensor, 0, esize);
  }
  int saved = errno;
  if (fclose(f) != 0 && r == 0) {
    r = -1;
    saved = errno;
  }
  if (r < 0) {
    remove(path);
    return sf_error_set(error, SF_EIO, SF_AT(.url = path), "cannot write %s: %s (check free disk space)", path,
                        strerror(saved));
  }
  return 0;
}
