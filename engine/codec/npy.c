/* NumPy .npy writer (format 1.0, for numpy.load()) and reader (formats 1.0-3.0, for the decode stage). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
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
  case SF_DTYPE_UINT16: return ENDIAN "u2";
  case SF_DTYPE_FLOAT64: return ENDIAN "f8";
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

/* ---- reader ------------------------------------------------------------------------------- */

/* numpy descriptors this reader maps to an sf_dtype: little-endian (or byte-order free) only. */
static bool dtype_of(const char *d, sf_dtype *out) {
  static const struct {
    const char *descr;
    sf_dtype dtype;
  } known[] = {{"|u1", SF_DTYPE_UINT8}, {"<u1", SF_DTYPE_UINT8}, {"<u2", SF_DTYPE_UINT16},
               {"<i4", SF_DTYPE_INT32}, {"<i8", SF_DTYPE_INT64}, {"<f4", SF_DTYPE_FLOAT32}};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (strcmp(d, known[i].descr) == 0) return *out = known[i].dtype, true;
  return false;
}

static size_t skip_space(const char *s, size_t n, size_t i) {
  while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
    i++;
  return i;
}

/* Reads a quoted Python string (no escapes: descriptors and keys have none) into out. */
static bool read_quoted(const char *s, size_t n, size_t *i, char *out, size_t cap) {
  if (*i >= n || (s[*i] != '\'' && s[*i] != '"')) return false;
  char q = s[(*i)++];
  size_t len = 0;
  while (*i < n && s[*i] != q) {
    if (s[*i] == '\\' || len + 1 >= cap) return false;
    out[len++] = s[(*i)++];
  }
  if (*i >= n) return false;
  (*i)++;
  out[len] = '\0';
  return true;
}

/* Reads a shape tuple "()", "(5,)", "(2, 3)" into h. */
static bool read_shape(const char *s, size_t n, size_t *i, sf_npy_header *h) {
  if (*i >= n || s[*i] != '(') return false;
  (*i)++;
  h->ndim = 0;
  for (;;) {
    *i = skip_space(s, n, *i);
    if (*i < n && s[*i] == ')') return (*i)++, true;
    if (h->ndim == SF_TENSOR_MAX_DIMS || *i >= n || s[*i] < '0' || s[*i] > '9') return false;
    int64_t v = 0;
    while (*i < n && s[*i] >= '0' && s[*i] <= '9') {
      if (v > (INT64_MAX - 9) / 10) return false;
      v = v * 10 + (s[(*i)++] - '0');
    }
    h->shape[h->ndim++] = v;
    *i = skip_space(s, n, *i);
    if (*i < n && s[*i] == ',')
      (*i)++;
    else if (*i >= n || s[*i] != ')')
      return false;
  }
}

int sf_npy_parse_header(const uint8_t *p, size_t n, sf_npy_header *h, sf_error *error) {
  memset(h, 0, sizeof *h);
  if (n < 10 || memcmp(p, "\x93NUMPY", 6) != 0)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "not a .npy file (no \\x93NUMPY magic)");
  unsigned major = p[6];
  if (major < 1 || major > 3)
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE, ".npy format version %u.%u is not supported (1.0-3.0)",
                        major, p[7]);
  size_t start = major == 1 ? 10 : 12;
  if (n < start) return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "truncated .npy preamble");
  size_t hlen = major == 1 ? (size_t)p[8] | (size_t)p[9] << 8
                           : (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
  if (hlen > n - start)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "truncated .npy header (%zu of %zu bytes)", n - start, hlen);
  /* The dict is ASCII (1.0, 2.0) or UTF-8 (3.0); keys and values this reader accepts are ASCII. */
  const char *s = (const char *)p + start;
  size_t i = skip_space(s, hlen, 0);
  bool have_descr = false, have_order = false, have_shape = false;
  if (i >= hlen || s[i++] != '{') goto corrupt;
  for (;;) {
    i = skip_space(s, hlen, i);
    if (i < hlen && s[i] == '}') break;
    char key[32];
    if (!read_quoted(s, hlen, &i, key, sizeof key)) goto corrupt;
    i = skip_space(s, hlen, i);
    if (i >= hlen || s[i++] != ':') goto corrupt;
    i = skip_space(s, hlen, i);
    if (strcmp(key, "descr") == 0) {
      if (i < hlen && s[i] == '[')
        return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                            ".npy dtype is a structured (record) dtype; only plain arrays are supported");
      if (!read_quoted(s, hlen, &i, h->descr, sizeof h->descr)) goto corrupt;
      have_descr = true;
    } else if (strcmp(key, "fortran_order") == 0) {
      if (hlen - i >= 4 && memcmp(s + i, "True", 4) == 0)
        h->fortran_order = true, i += 4;
      else if (hlen - i >= 5 && memcmp(s + i, "False", 5) == 0)
        i += 5;
      else
        goto corrupt;
      have_order = true;
    } else if (strcmp(key, "shape") == 0) {
      if (!read_shape(s, hlen, &i, h)) goto corrupt;
      have_shape = true;
    } else {
      goto corrupt;
    }
    i = skip_space(s, hlen, i);
    if (i < hlen && s[i] == ',')
      i++;
    else if (i >= hlen || s[i] != '}')
      goto corrupt;
  }
  if (!have_descr || !have_order || !have_shape) goto corrupt;
  if (!dtype_of(h->descr, &h->dtype))
    return sf_error_set(error, SF_EUNSUPPORTED, SF_NOWHERE,
                        ".npy dtype '%s' is not supported (uint8 '|u1', uint16 '<u2', int32 '<i4', int64 '<i8', "
                        "float32 '<f4'; convert with astype before saving)",
                        h->descr);
  sf_tensor probe;
  if (sf_tensor_set_shape(&probe, h->dtype, h->ndim, h->shape) < 0)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, ".npy shape overflows");
  h->data_offset = start + hlen;
  h->nbytes = sf_tensor_nbytes(&probe);
  if (h->nbytes > n - h->data_offset)
    return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "truncated .npy data: %zu of %zu bytes", n - h->data_offset,
                        h->nbytes);
  return 0;
corrupt:
  return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt .npy header dict near byte %zu: \"%.*s\"", start + i,
                      (int)(hlen < 80 ? hlen : 80), s);
}

int sf_npy_read(sf_buffer *buffer, size_t offset, size_t size, sf_tensor *out, sf_error *error) {
  memset(out, 0, sizeof *out);
  if (!buffer || offset > sf_buffer_size(buffer) || size > sf_buffer_size(buffer) - offset)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "bad arguments to sf_npy_read");
  const uint8_t *p = sf_buffer_data(buffer) + offset;
  sf_npy_header h;
  int r = sf_npy_parse_header(p, size, &h, error);
  if (r < 0) return r;
  /* Fortran order: the bytes are the C-order array of the reversed shape; transposing that view
     (reversed strides) gives the array numpy.load returns, without a copy. */
  int64_t shape[SF_TENSOR_MAX_DIMS];
  for (int d = 0; d < h.ndim; d++)
    shape[d] = h.fortran_order ? h.shape[h.ndim - 1 - d] : h.shape[d];
  size_t esize = sf_dtype_size(h.dtype);
  if ((uintptr_t)(p + h.data_offset) % esize == 0) {
    r = sf_tensor_view(out, h.dtype, h.ndim, shape, sf_buffer_ref(buffer), offset + h.data_offset);
  } else {
    /* Misaligned elements (a tar member starts at any multiple of 512 plus the .npy header):
       copy into a fresh, aligned buffer. */
    r = sf_tensor_alloc(out, h.dtype, h.ndim, shape);
    if (r == 0 && h.nbytes) memcpy(sf_tensor_data(out), p + h.data_offset, h.nbytes);
  }
  if (r < 0) return sf_error_set(error, r, SF_NOWHERE, "cannot hold a .npy array of %zu bytes", h.nbytes);
  if (h.fortran_order) {
    sf_tensor t = *out;
    for (int d = 0; d < h.ndim; d++) {
      out->shape[d] = t.shape[h.ndim - 1 - d];
      out->strides[d] = t.strides[h.ndim - 1 - d];
    }
  }
  return 0;
}
