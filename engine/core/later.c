/*
 * Memory chores on a thread of their own, so that the thread that would meet them goes on with the pipeline's
 * work while a core is free. Unmapping a shard takes its page-table entries down one by one: about a
 * millisecond for a 6 MiB shard, on whichever thread drops the shard's last view. With a shuffle buffer a
 * shard's last samples stay in it for most of the epoch, so at the epoch's end, while the buffer drains, batch
 * (the one stage still working) unmapped every shard whose samples were in it: half the CPU of the CIFAR
 * graph's drain, the other core idle. (Making the next 2 MiB slab of sample structs here, ahead of need, was
 * tried and measured no faster.) After fork() (a DataLoader's workers) the child has no such thread: it runs
 * what was waiting and starts its own at its next request.
 */
#include "later.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

typedef struct chore {
  void (*job)(void *arg);
  void *arg;
  struct chore *next;
} chore;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static chore *first, *last; /* waiting, in the order asked */
static bool started;        /* the thread runs (in this process) */
static pthread_once_t fork_handlers = PTHREAD_ONCE_INIT;

static void run_all(chore *c) {
  while (c) {
    chore *next = c->next;
    c->job(c->arg);
    free(c);
    c = next;
  }
}

static void *chores(void *unused) {
  (void)unused;
  pthread_mutex_lock(&lock);
  for (;;) {
    while (!first) pthread_cond_wait(&wake, &lock);
    chore *c = first;
    first = last = NULL;
    pthread_mutex_unlock(&lock);
    run_all(c);
    pthread_mutex_lock(&lock);
  }
  return NULL;
}

static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork_parent(void) { pthread_mutex_unlock(&lock); }

/* The child is one thread, the one that forked: the chores thread is not there, and the wait it was in is reset. */
static void after_fork_child(void) {
  chore *c = first;
  first = last = NULL;
  started = false;
  pthread_cond_init(&wake, NULL);
  pthread_mutex_unlock(&lock);
  run_all(c);
}

static void install_fork_handlers(void) { pthread_atfork(before_fork, after_fork_parent, after_fork_child); }

bool sf_later(void (*job)(void *arg), void *arg) {
  pthread_once(&fork_handlers, install_fork_handlers);
  chore *c = malloc(sizeof *c);
  if (!c) return false;
  *c = (chore){.job = job, .arg = arg};
  pthread_mutex_lock(&lock);
  if (!started) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    started = pthread_create(&thread, &attr, chores, NULL) == 0;
    pthread_attr_destroy(&attr);
  }
  if (started) {
    if (last) last->next = c;
    else first = c;
    last = c;
    pthread_cond_signal(&wake);
  }
  pthread_mutex_unlock(&lock);
  if (!started) free(c);
  return started;
}

typedef struct unmapping {
  void *data;
  size_t size;
} unmapping;

static void unmap_job(void *arg) {
  unmapping *u = arg;
  munmap(u->data, u->size);
  free(u);
}

void sf_unmap_later(void *data, size_t size) {
  unmapping *u = malloc(sizeof *u);
  if (u) *u = (unmapping){data, size};
  if (u && sf_later(unmap_job, u)) return;
  free(u);
  munmap(data, size);
}
