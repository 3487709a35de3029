/* `shardflow write`'s encoding: every distinct image once, as the output format, on a few threads. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/write.h"
#include "image.h"
#include "shardflow/error.h"

const char *const sf_write_format_names[] = {
    [SF_WRITE_PPM] = "ppm", [SF_WRITE_PNG] = "png", [SF_WRITE_JPG] = "jpg", [SF_WRITE_ORIG] = "orig", NULL};

typedef struct encode_job {
  sf_write_list *list;
  const sf_write_options *opt;
  atomic_size_t next;
  atomic_bool failed;
  pthread_mutex_t lock;
  char message[1024];
} encode_job;

static int encode_one(const sf_write_options *opt, sf_write_item *it, sf_error *err) {
  if (opt->format == SF_WRITE_ORIG && it->src) {
    it->out = sf_buffer_ref(it->src);
    it->out_ext = it->ext;
    sf_buffer_unref(&it->src);
    return 0;
  }
  sf_tensor img;
  int r = 0;
  if (it->src) {
    const char *fmt = strcmp(it->ext, "jpeg") == 0 ? "jpg" : it->ext;
    r = sf_image_decode(fmt, it->src, 0, sf_buffer_size(it->src), SF_IMAGE_RGB, NULL, &img, err);
    if (r < 0) return r;
  } else {
    sf_tensor_ref(&img, &it->pixels);
  }
  const char *fmt = opt->format == SF_WRITE_ORIG ? "ppm" : sf_write_format_names[opt->format];
  if (strcmp(fmt, "ppm") == 0 && img.ndim == 3 && img.shape[2] == 1) fmt = "pgm";
  r = sf_image_encode(fmt, &img, (int)opt->quality, &it->out, err);
  sf_tensor_clear(&img);
  if (r == 0) {
    it->out_ext = fmt;
    sf_buffer_unref(&it->src); /* the encoded bytes are all the repeats need */
    sf_tensor_clear(&it->pixels);
  }
  return r;
}

static void *encode_worker(void *arg) {
  encode_job *job = arg;
  for (;;) {
    size_t i = atomic_fetch_add(&job->next, 1);
    if (i >= job->list->n || atomic_load(&job->failed)) break;
    sf_write_item *it = &job->list->v[i];
    sf_error err = {0};
    int r = encode_one(job->opt, it, &err);
    if (r < 0) {
      pthread_mutex_lock(&job->lock);
      if (!atomic_exchange(&job->failed, true)) {
        const char *src = job->opt->input;
        bool tree = it->class_len > 0;
        snprintf(job->message, sizeof job->message, "%s%s%s: %s (%s)%s", tree ? src : "", tree ? "/" : "", it->name,
                 err.message[0] ? err.message : sf_strerror(r), sf_err_name(r),
                 tree ? "; fix or remove this image and run again" : "");
      }
      pthread_mutex_unlock(&job->lock);
      break;
    }
  }
  return NULL;
}

int sf_write_encode_all(sf_write_list *l, const sf_write_options *opt) {
  encode_job job = {.list = l, .opt = opt};
  atomic_init(&job.next, 0);
  atomic_init(&job.failed, false);
  pthread_mutex_init(&job.lock, NULL);
  int n = (int)opt->jobs;
  if ((size_t)n > l->n) n = l->n ? (int)l->n : 1;
  pthread_t *threads = calloc((size_t)n, sizeof *threads);
  int started = 0;
  if (threads)
    for (; started < n; started++)
      if (pthread_create(&threads[started], NULL, encode_worker, &job) != 0) break;
  if (started == 0) encode_worker(&job); /* no threads at all: do the work here */
  for (int i = 0; i < started; i++)
    pthread_join(threads[i], NULL);
  free(threads);
  pthread_mutex_destroy(&job.lock);
  return atomic_load(&job.failed) ? sf_write_fail("%s", job.message) : 0;
}
