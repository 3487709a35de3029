/* The pool of decoded images' buffers (see pixels.h). */
#include <pthread.h>
#include <string.h>

#include "pixels.h"
#include "shardflow/pool.h"

enum { SIZE_CLASS = 64 << 10, MAX_POOLED = 1 << 20, MAX_IDLE = 96 };

static pthread_once_t once = PTHREAD_ONCE_INIT;
static sf_pool *pool; /* lives as long as the process; NULL when it could not be made */

static void make_pool(void) { pool = sf_pool_new(MAX_IDLE); }

int sf_pixels_alloc(sf_tensor *out, sf_dtype dtype, int64_t h, int64_t w, int64_t c) {
  const int64_t shape[3] = {h, w, c};
  int r = sf_tensor_set_shape(out, dtype, 3, shape);
  if (r < 0) return r;
  size_t bytes = sf_tensor_nbytes(out), size = (bytes + SIZE_CLASS - 1) / SIZE_CLASS * SIZE_CLASS;
  pthread_once(&once, make_pool);
  if (!pool || size > MAX_POOLED || bytes == 0) return sf_tensor_alloc(out, dtype, 3, shape);
  sf_buffer *b = sf_pool_get(pool, size);
  if (!b) {
    memset(out, 0, sizeof *out);
    return SF_ENOMEM;
  }
  return sf_tensor_view(out, dtype, 3, shape, b, 0);
}
