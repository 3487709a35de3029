/* The log callback: one process-wide handler, the stderr default, and the log site behind it. */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

#include "log.h"

/* Readers are log calls (concurrent); the writer is sf_log_set_handler, which so waits for calls in flight. */
static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static sf_log_handler handler;
static void *handler_opaque;
/* Set while this thread runs a handler: its own log calls go to stderr, and it may not swap handlers. */
static _Thread_local bool in_handler;

static void print_default(int level, const char *stage, const char *message) {
  bool prefixed = !(level & SF_LOG_UNPREFIXED);
  fprintf(stderr, "%s%s%s%s%s\n", prefixed ? "shardflow: " : "",
          prefixed && (level & ~SF_LOG_UNPREFIXED) == SF_LOG_ERROR ? "error: " : "", stage ? stage : "",
          stage ? ": " : "", message);
}

int sf_log_set_handler(sf_log_handler h, void *opaque) {
  if (in_handler) return SF_EINVAL;
  pthread_rwlock_wrlock(&lock);
  handler = h;
  handler_opaque = opaque;
  pthread_rwlock_unlock(&lock);
  return 0;
}

void sf_log(int level, const char *stage, const char *fmt, ...) {
  char message[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  if (stage && !*stage) stage = NULL;
  if (in_handler) {
    print_default(level, stage, message);
    return;
  }
  pthread_rwlock_rdlock(&lock);
  if (handler) {
    in_handler = true;
    handler(handler_opaque, level & ~SF_LOG_UNPREFIXED, stage, message);
    in_handler = false;
  } else {
    print_default(level, stage, message);
  }
  pthread_rwlock_unlock(&lock);
}
