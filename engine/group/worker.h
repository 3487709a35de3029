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
  const char **endpoints;        /* the heads' group endpoints (tcp://HOST:PORT or ipc://PATH), one per head
                                    served (e.g. every rank of a job); borrowed */
  int n_endpoints;
  const char *name;              /* shown in the head's logs; NULL = HOST-PID */
  const char *secret_key_file;   /* tcp://: this worker's key file (`shardflow keygen`), for every head */
  const char **server_key_files; /* tcp://: the heads' public key files: one for all, or one per endpoint */
  int n_server_keys;
  bool plaintext;                /* tcp:// without CURVE (the head must allow it too) */
  const char **allowed_plugins;  /* plugin files (.so paths) this worker may load besides those found by name in
                                    SHARDFLOW_PLUGIN_PATH and $libdir/shardflow/plugins; borrowed */
  int n_allowed_plugins;
  int64_t threads;               /* pipeline threads; 0 = what the head says, else this host's CPUs */
  int64_t credits;               /* units decoding at once over all heads, and each head's credit (its queue
                                    here); 0 = 4 */
  double connect_timeout;        /* seconds to wait for the head's WELCOME; 0 = 60 */
  bool exit_with_parent;         /* a local worker started by a head: end when the head's process ends */
  int64_t shm_fd;                /* a local worker's shared-memory ring (a memfd its head passed), 0 = none:
                                    its results go there, the socket carries their extents (shm_ring.h) */
  volatile sig_atomic_t *stop;   /* set by a signal handler: leave cleanly (BYE), may be NULL */
  bool quiet;
} sf_worker_options;

/*
 * Runs the worker until every head has ended (said BYE, fell silent for its
 * heartbeat timeout, never answered within connect_timeout, or failed) or
 * *stop is set.  Each head runs its own stages (from its WELCOME); the
 * decode slots are shared evenly among the heads with work waiting.
 * The plugins a head's stages need are loaded by file name: an entry the
 * head names (a name, or a path whose last component NAME.so is used) is
 * one of allowed_plugins with that file name, else NAME.so found in this
 * worker's own plugin path; a directory the head names is never opened, so
 * a head cannot make its workers run code of its choosing.
 * Returns 0 when every head ended cleanly; else the first failed head's
 * error: SF_ENET (no head answered, the head was lost), SF_EDENIED/SF_ENOENT/
 * SF_EFORMAT (keys), SF_EGRAPH (the head's stages do not build here, e.g. a
 * plugin this worker lacks), SF_EINVAL (no endpoint; as many server keys as
 * endpoints needed), or the pipeline's failure; *error says which and what to do.
 */
int sf_worker_run(const sf_worker_options *options, sf_error *error);

#endif
