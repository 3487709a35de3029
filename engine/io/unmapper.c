/*
 * Unmapping a shard takes its page-table entries down one by one: about a millisecond for a 6 MiB shard, on
 * whichever thread drops the shard's last view. With a shuffle buffer, a shard's last samples stay in it
 * for most of the epoch, so at the epoch's end the buffer drains and batch, the one stage still working,
 * unmapped every shard whose samples were in it: half the CPU of the CIFAR graph's drain, while the other
 * core waited. One thread here does it instead, in parallel. After fork() (a DataLoader's workers) the child
 * has no such thread: it unmaps what was waiting and starts its own at its next request.
 */
#include "unmapper.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>

typedef struct request {
  void *data;
  size_t size;
  struct request *next;
} request;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static request *waiting; /* what the thread has yet to unmap */
static bool started;     /* the thread runs (in this process) */
static pthread_once_t fork_handlers = PTHREAD_ONCE_INIT;

static void unmap_all(request *r) {
  while (r) {
    request *next = r->next;
    munmap(r->data, r->size);
    free(r);
    r = next;
  }
}

static void *unmapper(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lock);
  for (;;) {
    while (!waiting) pthread_cond_wait(&wake, &lock);
    request *r = waiting;
    waiting = NULL;
    pthread_mutex_unlock(&lock);
    unmap_all(r);
    pthread_mutex_lock(&lock);
  }
  return NULL;
}

static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&lock); }

/* The child is one thread, the one that forked: the unmapper is not there, and the wait it was in is reset. */
static void after_fork_child(void) {
  request *r = waiting;
  waiting = NULL;
  started = false;
  pthread_cond_init(&wake, NULL);
  pthread_mutex_unlock(&lock);
  unmap_all(r);
}

static void install_fork_handlers(void) { pthread_atfork(before_fork, after_fork_parent, after_fork_child); }

void sf_unmap_later(void *data, size_t size) {
  pthread_once(&fork_handlers, install_fork_handlers);
  request *r = malloc(sizeof *r);
  if (!r) {
    munmap(data, size);
    return;
  }
  *r = (request){.data = data, .size = size};
  pthread_mutex_lock(&lock);
  if (!started) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    started = pthread_create(&thread, &attr, unmapper, NULL) == 0;
    pthread_attr_destroy(&attr);
  }
  if (started) {
    r->next = waiting;
    waiting = r;
    pthread_cond_signal(&wake);
  }
  pthread_mutex_unlock(&lock);
  if (!started) {
    munmap(data, size);
    free(r);
  }
}
