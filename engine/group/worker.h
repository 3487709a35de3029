/*
 * A worker process: joins a head over ZeroMQ, receives its group's stages and
 * runs work units through them (`shardflow worker --connect ENDPOINT`).
 * docs/protocol.md has the message sequence.
 */
#ifndef SF_ENGINE_WORKER_H
#define SF_ENGINE_WORKER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "shardflow/error.h"

typedef struct sf_worker_options {
  const char *endpoint;          /* the head's group endpoint: tcp://HOST:PORT or ipc://PATH */
  const char *name;              /* shown in the head's logs; NULL = HOST-PID */
  const char *secret_key_file;   /* tcp://: this worker's key file (`shardflow keygen`) */
  const char *server_key_file;   /* tcp://: the head's public key file */
  bool plaintext;                /* tcp:// without CURVE (the head must allow it too) */
  const char *rendezvous;        /* the CLI's --rendezvous FILE (rendezvous.h); sf_worker_run ignores it */
  int64_t threads;               /* pipeline threads; 0 = what the head says, else this host's CPUs */
  int64_t credits;               /* work units held at once (queued + running); 0 = 4 */
  double connect_timeout;        /* seconds to wait for the head's WELCOME; 0 = 60 */
  bool exit_with_parent;         /* a local worker started by a head: end when the head's process ends */
  volatile sig_atomic_t *stop;   /* set by a signal handler: leave cleanly (BYE), may be NULL */
  bool quiet;
} sf_worker_options;

/*
 * Runs the worker until the head says BYE, *stop is set, or the head falls
 * silent for its heartbeat timeout.  Returns 0 after a clean end; SF_ENET
 * (no head answered, the head was lost), SF_EDENIED/SF_ENOENT/SF_EFORMAT
 * (keys), SF_EGRAPH (the head's stages do not build here, e.g. a plugin this
 * worker lacks), or the pipeline's failure; *error says which and what to do.
 */
int sf_worker_run(const sf_worker_options *options, sf_error *error);

#endif
