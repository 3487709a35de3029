/* NumPy .npz reader: libzip walks the archive (stored or deflated members), npy.c reads each array. */
#include <stdio.h>
#include <string.h>

#include <zip.h>

#include "npy.h"
#include "npz.h"

/* Inflates member i (size bytes, as the central directory says) into a new buffer. */
static int read_member(zip_t *zip, zip_uint64_t i, const char *name, zip_uint64_t size, sf_buffer **out,
                       sf_error *error) {
  *out = sf_buffer_new((size_t)size);
  if (!*out)
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate %llu bytes for member %s",
                        (unsigned long long)size, name);
  zip_file_t *f = zip_fopen_index(zip, i, 0);
  zip_int64_t got = f ? zip_fread(f, sf_buffer_data(*out), size) : -1;
  /* One more byte would mean the member is longer than its directory entry says. */
  uint8_t extra;
  if (f && got == (zip_int64_t)size && zip_fread(f, &extra, 1) != 0) got = -1;
  const char *why = f ? zip_file_strerror(f) : zip_strerror(zip);
  int r = 0;
  if (got != (zip_int64_t)size)
    r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt .npz member %s: %s", name, why);
  if (f) zip_fclose(f);
  if (r < 0) sf_buffer_unref(out);
  return r;
}

int sf_npz_read(sf_buffer *buffer, size_t offset, size_t size, size_t max_member, sf_npz_array_fn fn, void *opaque,
                sf_error *error) {
  if (!buffer || offset > sf_buffer_size(buffer) || size > sf_buffer_size(buffer) - offset)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "bad arguments to sf_npz_read");
  zip_error_t ze;
  zip_error_init(&ze);
  zip_source_t *src = zip_source_buffer_create(sf_buffer_data(buffer) + offset, size, 0, &ze);
  zip_t *zip = src ? zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &ze) : NULL;
  if (!zip) {
    int r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "not a valid .npz (zip) file: %s", zip_error_strerror(&ze));
    zip_source_free(src);
    zip_error_fini(&ze);
    return r;
  }
  zip_error_fini(&ze);
  int r = 0;
  zip_int64_t n = zip_get_num_entries(zip, 0);
  for (zip_int64_t i = 0; r == 0 && i < n; i++) {
    zip_stat_t st;
    if (zip_stat_index(zip, (zip_uint64_t)i, 0, &st) != 0 || !(st.valid & ZIP_STAT_NAME) ||
        !(st.valid & ZIP_STAT_SIZE)) {
      r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt .npz entry %lld: %s", (long long)i, zip_strerror(zip));
      break;
    }
    size_t len = strlen(st.name);
    if (len <= 4 || strcmp(st.name + len - 4, ".npy") != 0) {
      r = sf_error_set(error, SF_EFORMAT, SF_NOWHERE, ".npz member %s is not a .npy file", st.name);
      break;
    }
    if (st.size > max_member) {
      r = sf_error_set(error, SF_ETOOBIG, SF_NOWHERE, ".npz member %s inflates to %llu bytes, over max_field_size",
                       st.name, (unsigned long long)st.size);
      break;
    }
    sf_buffer *member = NULL;
    if ((r = read_member(zip, (zip_uint64_t)i, st.name, st.size, &member, error)) < 0) break;
    sf_tensor array;
    r = sf_npy_read(member, 0, (size_t)st.size, &array, error);
    sf_buffer_unref(&member);
    if (r < 0) {
      char why[sizeof error->message];
      snprintf(why, sizeof why, "%s", error->message);
      r = sf_error_set(error, r, SF_NOWHERE, ".npz member %s: %s", st.name, why);
      break;
    }
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(len - 4), st.name);
    r = fn(opaque, name, &array, error);
    sf_tensor_clear(&array);
  }
  zip_discard(zip);
  return r;
}
