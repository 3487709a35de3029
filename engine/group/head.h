/*
 * The head of a group: what its three files share.  head.c is the stage the engine puts in the head's
 * graph in place of the group's stages (options, init, step, uninit, statistics), head_net.c the
 * network thread (HELLO and WELCOME, units out, results in, heartbeats, lost and late workers),
 * head_local.c the worker processes the head starts on its own host.  Which unit is where, and what a
 * result or a lost worker changes, is unit_window.c.  docs/protocol.md has the message sequence.
 */
#ifndef SF_ENGINE_GROUP_HEAD_H
#define SF_ENGINE_GROUP_HEAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "node.h"
#include "shm_ring.h"
#include "transport.h"
#include "unit_window.h"
#include "wire.h"

enum { SF_HEAD_MAX_WORKERS = 1024, SF_HEAD_MAX_LOGGED = 20 };

/* A worker as the sockets and the progress line know it; its scheduling state is units->workers[same index]. */
typedef struct sf_head_worker {
  int socket;            /* 0: the listen socket, 1: the local ipc socket */
  sf_wire_peer peer;
  char name[64];
  int64_t pid;
  double last_seen, joined;
  uint64_t samples, units;
  /* for the rate shown on the progress line */
  uint64_t rate_samples;
  double rate_since, rate;
  sf_wire_stage_stats stats[SF_WIRE_MAX_STATS];
  int n_stats;
  sf_shm_ring *ring;     /* a local process's shared-memory ring (its results arrive there), or NULL */
  uint64_t freed_sent;   /* the ring's release position last told to the worker */
  bool unreachable;      /* a send failed: released once what it sent before leaving (a BYE) is read */
} sf_head_worker;

/* The head node's private struct: the group's options first (the table in head.c), then its run state. */
typedef struct sf_head {
  /* options: the group's configuration */
  int64_t processes;
  char *listen;
  char *secret_key, *allowed_keys;
  bool plaintext;
  char *rendezvous;
  int64_t unit_samples;
  int64_t window;
  int64_t buffer_size;
  double heartbeat_interval, heartbeat_timeout, worker_timeout;
  int64_t worker_threads;
  char *worker_command;
  int64_t max_message;
  int64_t io_threads;
  int64_t shm_ring;
  int wire_form; /* read by the plan (engine/graph/graph_plan.c), which rewrites the stages before this node exists */
  const sf_graph *stages; /* the group's stages (the head's graph nodes), sent to workers in WELCOME */

  sf_node *node;
  char ipc_dir[108];      /* a private directory (mkdtemp, 0700) for the local socket, one per pipeline */
  char ipc_path[120];     /* ipc_dir/local.ipc: init keeps it within a unix socket path's 107 bytes */
  void *zctx;
  sf_transport *sockets[2];
  bool wrote_rendezvous;
  int wake_fd;
  pthread_t thread;
  bool thread_started;
  atomic_bool stop;
  pid_t *children;
  sf_shm_ring **rings;   /* each local process's ring (a restarted one gets a new ring; views keep the old one) */
  int n_children;
  int respawns;

  pthread_mutex_t lock;
  sf_unit_window *units; /* the ordered window, and which worker holds what */
  sf_sample **open;      /* the unit being filled from the input */
  int n_open;
  bool input_done;
  int failed;            /* an error the step must return (error policy fail, lost workers) */
  sf_error failure;      /* the network thread's reason for failed, recorded by the step (the stage's own record) */
  bool failure_pending;
  sf_head_worker workers[SF_HEAD_MAX_WORKERS];
  double no_worker_since;
  uint64_t epochs_ended, epochs_announced; /* epoch markers passed on / told to the workers (EPOCH_END) */
  /* counts */
  uint64_t malformed, logged;
  uint64_t ring_bytes, socket_bytes; /* result payload bytes taken through the rings / the sockets */
  double last_wait_log;
} sf_head;

/* Monotonic seconds. */
static inline double sf_head_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* True while worker wi is alive (the window's view of it). Lock held. */
static inline bool sf_head_live(const sf_head *r, int wi) { return r->units->workers[wi].live; }

/* head_net.c: the network thread (arg: the sf_head), until r->stop. */
void *sf_head_network_thread(void *arg);
/* Wakes the network thread (units to dispatch, the end of the run). Any thread. */
void sf_head_wake(sf_head *r);
/* Fails the run with e; the step records it, so it is the stage's record (not a generic "stopped"). Lock held. */
static inline void sf_head_fail(sf_head *r, const sf_error *e) {
  if (r->failed) return;
  r->failure = *e;
  r->failure_pending = true;
  r->failed = e->code;
  sf_node_notify(r->node);
}

/* head_local.c: starts local worker process index (its ring, its argv). 0, or SF_ENOMEM / SF_ENOENT in *error. */
int sf_head_spawn_worker(sf_head *r, int index, sf_error *error);
/* Local workers that died are started again (a few times); the run fails once none is left and none can join.
 * Network thread, without the lock. */
void sf_head_reap_children(sf_head *r);

#endif
