/*
 * _remote: a group's stages running in worker processes (the head's side).
 *
 * The node cuts its input into work units (up to unit_samples consecutive
 * samples of one shard), hands them to workers over ZeroMQ as they ask for
 * work (credits), and passes the results on in unit order, so the samples
 * leave in exactly the order they came in and the batches do not depend on
 * how many workers there are or which one ran what.  A network thread owns
 * the sockets: it answers HELLO with the group's stages, dispatches units,
 * takes RESULTs, sends heartbeats, declares a silent worker dead and gives
 * its units to others; a RESULT for a unit already finished is a duplicate
 * and is dropped.  A unit held far longer than units take (SF_UNIT_LATE_FACTOR
 * times the observed time) goes to another worker too: a worker that
 * heartbeats but never answers does not stall the epoch.  Which unit is
 * where, and what a result or a lost worker changes, is engine/group/unit_window.c;
 * this file is its I/O: sockets, the thread, local processes, the stage.
 * docs/protocol.md has the message sequence.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "files.h"
#include "log.h"
#include "node.h"
#include "remote.h"
#include "rendezvous.h"
#include "transport.h"
#include "unit_window.h"
#include "wire.h"

extern char **environ;

enum { MAX_WORKERS = 1024, MAX_LOGGED = 20 };

/* A worker as the sockets and the progress line know it; its scheduling state is units->workers[same index]. */
typedef struct worker {
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
} worker;

typedef struct remote {
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
  worker workers[MAX_WORKERS];
  double no_worker_since;
  uint64_t epochs_ended, epochs_announced; /* epoch markers passed on / told to the workers (EPOCH_END) */
  /* counts */
  uint64_t malformed, logged;
  uint64_t ring_bytes, socket_bytes; /* result payload bytes taken through the rings / the sockets */
  double last_wait_log;
} remote;

static const char *const wire_form_names[] = {"auto", "as_written", NULL};

static const sf_option options[] = {
    {"processes", SF_OPT_COUNT, offsetof(remote, processes), "0", 0, 256,
     "worker processes the head starts on its own host (connected over ipc://)", NULL},
    {"listen", SF_OPT_STRING, offsetof(remote, listen), "", 0, 0,
     "endpoint remote workers connect to: tcp://ADDR:PORT (CURVE unless plaintext) or ipc://PATH", NULL},
    {"secret_key", SF_OPT_STRING, offsetof(remote, secret_key), "", 0, 0,
     "the head's key file from `shardflow keygen` (tcp:// listen)", NULL},
    {"allowed_keys", SF_OPT_STRING, offsetof(remote, allowed_keys), "", 0, 0,
     "workers admitted on tcp://: a file of public keys (one a line) or a directory of *.pub files", NULL},
    {"plaintext", SF_OPT_BOOL, offsetof(remote, plaintext), "false", 0, 0,
     "accept unauthenticated, unencrypted tcp:// connections (trusted networks only)", NULL},
    {"rendezvous", SF_OPT_STRING, offsetof(remote, rendezvous), "", 0, 0,
     "a file the head writes once listening (endpoint and public key) and removes at the end; workers started by a "
     "scheduler find the head with `shardflow worker --rendezvous FILE` (needs listen:)",
     NULL},
    {"unit_samples", SF_OPT_COUNT, offsetof(remote, unit_samples), "32", 1, 4096,
     "samples in one work unit (a range of one shard); with local processes, a multiple of the batch's "
     "batch_size lets each batch be a view of a worker's shared-memory ring instead of a copy", NULL},
    {"window", SF_OPT_COUNT, offsetof(remote, window), "16", 2, 4096,
     "work units the head holds at once (waiting, at workers, or done but not yet passed on)", NULL},
    {"buffer_size", SF_OPT_SIZE, offsetof(remote, buffer_size), "256MiB", 1048576, 1099511627776.0,
     "bytes of results the head holds at most; shrinks the window for large samples", NULL},
    {"heartbeat_interval", SF_OPT_DURATION, offsetof(remote, heartbeat_interval), "1s", 0.01, 3600,
     "seconds between heartbeats in both directions", NULL},
    {"heartbeat_timeout", SF_OPT_DURATION, offsetof(remote, heartbeat_timeout), "5s", 0.05, 86400,
     "seconds of silence after which a worker is dead and its units go to others", NULL},
    {"worker_timeout", SF_OPT_DURATION, offsetof(remote, worker_timeout), "0", 0, 864000,
     "fail when work waits this long with no live worker (0 = wait, logging every 10 s)", NULL},
    {"worker_threads", SF_OPT_COUNT, offsetof(remote, worker_threads), "0", 0, 1024,
     "threads of each worker's pipeline (0 = the worker's CPUs)", NULL},
    {"worker_command", SF_OPT_STRING, offsetof(remote, worker_command), "", 0, 0,
     "the shardflow executable for local processes (default: this one, or $SHARDFLOW_BIN, or shardflow on PATH)",
     NULL},
    {"max_message", SF_OPT_SIZE, offsetof(remote, max_message), "256MiB", 65536, 1099511627776.0,
     "largest message accepted from a worker (ZMQ_MAXMSGSIZE)", NULL},
    {"io_threads", SF_OPT_COUNT, offsetof(remote, io_threads), "1", 1, 64,
     "ZeroMQ I/O threads of the head: CURVE decryption of each worker's stream runs on one; more than 1 spreads "
     "several workers' streams (refusal counts by kind may then be off by one: monitor events interleave)",
     NULL},
    {"shm_ring", SF_OPT_SIZE, offsetof(remote, shm_ring), "64MiB", 0, 1099511627776.0,
     "shared memory each local process writes its results into (the socket then carries only headers); a result "
     "that does not fit goes through the socket; 0 = off",
     NULL},
    {"wire_form", SF_OPT_ENUM, offsetof(remote, wire_form), "auto", 0, 0,
     "the form results travel in to the head: auto lets the plan send a last augment's float32/bfloat16 output as "
     "uint8 HWC crops, normalised by an augment it adds on the head (same batches, 4x/2x fewer bytes); as_written "
     "sends what the group's stages make",
     wire_form_names},
    {NULL},
};

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void wake_thread(remote *r) {
  uint64_t one = 1;
  ssize_t n = write(r->wake_fd, &one, sizeof one);
  (void)n;
}

static bool live(const remote *r, int wi) { return r->units->workers[wi].live; }

/* ---- the network thread ---- */

/* Fails the run with e; the step records it, so it is the stage's record (not a generic "stopped"). Lock held. */
static void fail_run(remote *r, const sf_error *e) {
  if (r->failed) return;
  r->failure = *e;
  r->failure_pending = true;
  r->failed = e->code;
  sf_node_notify(r->node);
}

static int send_to(remote *r, worker *w, sf_wire_message *m) {
  m->peer = w->peer;
  if (w->ring && (m->type == SF_WIRE_UNIT || m->type == SF_WIRE_HEARTBEAT)) m->shm_freed = sf_shm_ring_freed(w->ring);
  sf_error e;
  int rc = sf_wire_send(sf_transport_socket(r->sockets[w->socket]), m, ZMQ_DONTWAIT, &e);
  if (rc == 0 && m->shm_freed) w->freed_sent = m->shm_freed;
  return rc;
}

/* Gives a worker's units back to the queue (it died or left). Called with the lock held. */
static void release_worker(remote *r, int wi, const char *why) {
  worker *w = &r->workers[wi];
  int requeued = sf_unit_window_leave(r->units, wi);
  if (requeued < 0) return;
  sf_log(SF_LOG_WARNING, sf_node_name(r->node), "worker %s (pid %lld) %s; %d unit%s handed to other workers", w->name, (long long)w->pid, why, requeued,
           requeued == 1 ? "" : "s");
}

static int find_worker(remote *r, int socket, const sf_wire_peer *peer) {
  for (int i = 0; i < r->units->n_workers; i++) {
    worker *w = &r->workers[i];
    if (live(r, i) && w->socket == socket && w->peer.len == peer->len && memcmp(w->peer.id, peer->id, peer->len) == 0)
      return i;
  }
  return -1;
}

static void on_hello(remote *r, int socket, sf_wire_message *m, double now) {
  int old = find_worker(r, socket, &m->peer);
  if (old >= 0) release_worker(r, old, "said hello again");
  int wi = sf_unit_window_join(r->units);
  if (wi < 0) return;
  worker *w = &r->workers[wi];
  sf_shm_ring_unref(&w->ring);
  memset(w, 0, sizeof *w);
  w->socket = socket;
  w->peer = m->peer;
  for (int i = 0; socket == 1 && i < r->n_children; i++) /* a process this head started: its ring */
    if (r->children[i] > 0 && r->children[i] == m->pid && r->rings[i]) w->ring = sf_shm_ring_ref(r->rings[i]);
  snprintf(w->name, sizeof w->name, "%s", m->text ? m->text : "?");
  w->pid = m->pid;
  w->joined = w->last_seen = w->rate_since = now;
  sf_wire_message welcome = {
      .type = SF_WIRE_WELCOME,
      .stages = (sf_graph *)r->stages,
      .seed = r->node->ctx->seed,
      .epochs = r->node->ctx->epochs,
      .rank = r->node->ctx->rank,
      .world_size = r->node->ctx->world_size,
      .error_policy = r->node->ctx->error_policy,
      .heartbeat_interval = r->heartbeat_interval,
      .heartbeat_timeout = r->heartbeat_timeout,
      .threads = (uint32_t)r->worker_threads,
  };
  send_to(r, w, &welcome);
  sf_log(SF_LOG_INFO, sf_node_name(r->node), "worker %s (pid %lld, %u threads) joined", w->name, (long long)w->pid, m->threads);
}

static void on_result(remote *r, int wi, sf_wire_message *m, double now) {
  worker *w = wi >= 0 ? &r->workers[wi] : NULL;
  sf_unit *u;
  sf_unit_answer answer = sf_unit_window_result(r->units, wi, m->unit, m->samples, m->n_samples, now, &u);
  r->ring_bytes += m->ring_bytes;
  r->socket_bytes += m->frame_bytes;
  if (answer == SF_UNIT_FOREIGN) {
    r->malformed++;
    if (r->logged++ < MAX_LOGGED)
      sf_log(SF_LOG_WARNING, sf_node_name(r->node), "worker %s sent a result for unit %llu whose samples are not the unit's; dropped",
               w ? w->name : "?", (unsigned long long)m->unit);
  }
  if (answer != SF_UNIT_TAKEN) return;
  uint64_t skipped = m->skipped;
  if (skipped) sf_node_count_skipped(r->node, skipped);
  if (m->filtered) sf_node_count_filtered(r->node, m->filtered);
  for (int i = 0; i < m->n_errors; i++) {
    int rc = sf_node_error_record(r->node, &m->errors[i]);
    if (rc < 0 && !r->failed) r->failed = rc;
  }
  if (w) {
    w->samples += (uint64_t)m->n_samples;
    w->units++;
    if (m->n_stats > 0) {
      w->n_stats = m->n_stats < SF_WIRE_MAX_STATS ? m->n_stats : SF_WIRE_MAX_STATS;
      memcpy(w->stats, m->stats, (size_t)w->n_stats * sizeof *w->stats);
    }
  }
  sf_node_notify(r->node);
}

static void handle(remote *r, int socket, sf_wire_message *m, double now) {
  int wi = find_worker(r, socket, &m->peer);
  if (m->type == SF_WIRE_HELLO) {
    on_hello(r, socket, m, now);
    return;
  }
  if (wi < 0) {
    /* a worker declared dead that is still talking: its results still count once */
    if (m->type == SF_WIRE_RESULT) on_result(r, -1, m, now);
    return;
  }
  worker *w = &r->workers[wi];
  w->last_seen = now;
  switch (m->type) {
  case SF_WIRE_CREDIT: sf_unit_window_credit(r->units, wi, m->credits); break;
  case SF_WIRE_RESULT: on_result(r, wi, m, now); break;
  case SF_WIRE_HEARTBEAT:
    if (m->n_stats > 0) {
      w->n_stats = m->n_stats < SF_WIRE_MAX_STATS ? m->n_stats : SF_WIRE_MAX_STATS;
      memcpy(w->stats, m->stats, (size_t)w->n_stats * sizeof *w->stats);
    }
    break;
  case SF_WIRE_ERROR:
    /* a worker that cannot run the group's stages: for a local process the group cannot run at all */
    for (int i = 0; i < m->n_errors; i++) {
      sf_error e = m->errors[i];
      char prefix[96];
      snprintf(prefix, sizeof prefix, "worker %s: ", w->name);
      size_t pl = strlen(prefix);
      memmove(e.message + pl, e.message, sizeof e.message - pl - 1);
      memcpy(e.message, prefix, pl);
      e.message[sizeof e.message - 1] = '\0';
      int rc = sf_node_error_record(r->node, &e);
      if (!r->failed && (rc < 0 || w->socket == 1)) r->failed = e.code < 0 ? e.code : SF_EINTERNAL;
    }
    release_worker(r, wi, "failed");
    sf_node_notify(r->node);
    break;
  case SF_WIRE_BYE:
    if (m->text && m->text[0]) sf_log(SF_LOG_WARNING, sf_node_name(r->node), "worker %s says: %s", r->workers[wi].name, m->text);
    release_worker(r, wi, "left");
    break;
  default: r->malformed++; break;
  }
}

/* Hands late units to another worker too; whichever result comes first is kept. Called with the lock held. */
static void hand_on_late_units(remote *r, double now) {
  sf_unit *u;
  while ((u = sf_unit_window_next_late(r->units, now)) != NULL)
    if (r->logged++ < MAX_LOGGED)
      sf_log(SF_LOG_WARNING, sf_node_name(r->node), "unit %llu is late: %.1f s at worker %s while units take %.3f s; handed to another worker too",
               (unsigned long long)u->id, now - u->sent_at, r->workers[u->worker].name, r->units->unit_seconds);
}

/* Sends pending units, oldest first, to live workers with credit. Called with the lock held. */
static void dispatch(remote *r, double now) {
  for (int i = 0; i < r->units->count; i++) {
    sf_unit *u = sf_unit_window_at(r->units, i);
    if (u->state != SF_UNIT_PENDING) continue;
    if (u->attempts >= SF_UNIT_MAX_ATTEMPTS) {
      /* a unit that took several workers down with it: skip its samples rather than lose more workers */
      sf_error e;
      sf_error_set(&e, SF_EIO,
                   SF_AT(.stage = sf_node_name(r->node), .url = sf_sample_url(u->in[0]), .key = u->in[0]->key,
                         .offset = u->in[0]->offset),
                   "work unit %llu (%d samples from this key on) was lost with %d workers; its samples are skipped",
                   (unsigned long long)u->id, u->n_in, u->attempts);
      int rc = sf_node_error_record(r->node, &e);
      if (rc < 0 && !r->failed) r->failed = rc;
      sf_node_count_skipped(r->node, (uint64_t)u->n_in);
      sf_unit_window_skip(r->units, u);
      sf_node_notify(r->node);
      continue;
    }
    int chosen = sf_unit_window_choose(r->units);
    if (chosen < 0) return;
    worker *w = &r->workers[chosen];
    sf_wire_message m = {.type = SF_WIRE_UNIT, .unit = u->id, .epoch = u->epoch, .samples = u->in, .n_samples = u->n_in};
    int rc = send_to(r, w, &m);
    if (rc == SF_EAGAIN) return;
    if (rc < 0) {
      /* Gone, perhaps with a BYE still unread (a worker stopped by SIGTERM): the network thread reads
       * the sockets first, then releases it as left or as unreachable (release_unreachable). */
      w->unreachable = true;
      return;
    }
    sf_unit_window_sent(r->units, u, chosen, now);
  }
}

static void reap_children(remote *r);

/* Heartbeats out, silent workers declared dead, the no-worker timeout. Called with the lock held. */
static void housekeeping(remote *r, double now, double *last_beat) {
  if (r->epochs_announced < r->epochs_ended) {
    r->epochs_announced = r->epochs_ended;
    for (int i = 0; i < r->units->n_workers; i++)
      if (live(r, i)) {
        sf_wire_message end = {.type = SF_WIRE_EPOCH_END, .epoch = r->epochs_ended - 1};
        send_to(r, &r->workers[i], &end);
      }
  }
  if (now - *last_beat >= r->heartbeat_interval) {
    *last_beat = now;
    for (int i = 0; i < r->units->n_workers; i++) {
      worker *w = &r->workers[i];
      if (!live(r, i)) continue;
      sf_wire_message hb = {.type = SF_WIRE_HEARTBEAT};
      send_to(r, w, &hb);
      double span = now - w->rate_since;
      if (span >= 1.0) {
        w->rate = (double)(w->samples - w->rate_samples) / span;
        w->rate_samples = w->samples;
        w->rate_since = now;
      }
    }
  }
  /* a ring a quarter freed is worth a message of its own: the worker may be sending through the socket */
  for (int i = 0; i < r->units->n_workers; i++) {
    worker *w = &r->workers[i];
    if (live(r, i) && w->ring && sf_shm_ring_freed(w->ring) - w->freed_sent >= sf_shm_ring_size(w->ring) / 4) {
      sf_wire_message hb = {.type = SF_WIRE_HEARTBEAT};
      send_to(r, w, &hb);
    }
  }
  int n_live = 0;
  for (int i = 0; i < r->units->n_workers; i++) {
    worker *w = &r->workers[i];
    if (!live(r, i)) continue;
    if (now - w->last_seen > r->heartbeat_timeout) {
      char why[96];
      snprintf(why, sizeof why, "missed heartbeats for %.1f s", now - w->last_seen);
      release_worker(r, i, why);
      continue;
    }
    n_live++;
  }
  if (n_live > 0 || !sf_unit_window_has_pending(r->units)) {
    r->no_worker_since = 0;
    return;
  }
  if (r->no_worker_since == 0) r->no_worker_since = now;
  double waited = now - r->no_worker_since;
  if (r->worker_timeout > 0 && waited > r->worker_timeout && !r->failed) {
    sf_error e;
    sf_error_set(&e, SF_ETIMEDOUT, SF_AT(.stage = sf_node_name(r->node)),
                 "no live worker for %.0f s (worker_timeout) while work waits: start workers with `shardflow worker "
                 "--connect %s` or give the group `processes:`",
                 waited, r->listen[0] ? r->listen : "ENDPOINT");
    fail_run(r, &e);
  } else if (now - r->last_wait_log >= 10) {
    r->last_wait_log = now;
    sf_log(SF_LOG_WARNING, sf_node_name(r->node), "waiting for workers: none alive for %.0f s%s", waited,
             r->listen[0] ? "; they connect to the group's listen endpoint" : "");
  }
}

/* sf_wire_ring_fn for the local socket: the ring of the process that sent a message (alive or declared dead). */
static sf_shm_ring *ring_of(void *opaque, const sf_wire_peer *peer) {
  remote *r = opaque;
  sf_shm_ring *ring = NULL;
  pthread_mutex_lock(&r->lock);
  for (int i = r->units->n_workers - 1; i >= 0 && !ring; i--) {
    worker *w = &r->workers[i];
    if (w->socket == 1 && w->ring && w->peer.len == peer->len && memcmp(w->peer.id, peer->id, peer->len) == 0)
      ring = sf_shm_ring_ref(w->ring);
  }
  pthread_mutex_unlock(&r->lock);
  return ring;
}

/*
 * Reads and handles the messages waiting on the sockets (items[0..n), whose group socket is socket_of[k]):
 * those poll found readable, or all of them. Called without the lock.
 */
static void receive(remote *r, zmq_pollitem_t *items, const int *socket_of, int n, bool all) {
  for (int k = 0; k < n; k++) {
    if (!all && !(items[k].revents & ZMQ_POLLIN)) continue;
    for (int budget = 0; budget < 256; budget++) {
      sf_wire_message m;
      sf_error e;
      int rc = socket_of[k] == 1 ? sf_wire_recv_ring(items[k].socket, true, ring_of, r, &m, ZMQ_DONTWAIT, &e)
                                 : sf_wire_recv(items[k].socket, true, &m, ZMQ_DONTWAIT, &e);
      if (rc == SF_EAGAIN) break;
      pthread_mutex_lock(&r->lock);
      if (rc == 0) {
        handle(r, socket_of[k], &m, now_seconds());
      } else if (rc == SF_EFORMAT || rc == SF_ETOOBIG) {
        r->malformed++;
        if (r->logged++ < MAX_LOGGED) sf_log(SF_LOG_WARNING, sf_node_name(r->node), "dropped a malformed message: %s", e.message);
        if (strstr(e.message, "wire version") && m.peer.len > 0) {
          /* a worker of another shardflow: tell it why it gets no work (BYE reads across versions) */
          sf_wire_message bye = {.type = SF_WIRE_BYE, .peer = m.peer, .text = e.message};
          sf_error ignored;
          sf_wire_send(items[k].socket, &bye, ZMQ_DONTWAIT, &ignored);
        }
      }
      pthread_mutex_unlock(&r->lock);
      sf_wire_message_clear(&m);
      if (rc < 0 && rc != SF_EFORMAT && rc != SF_ETOOBIG) break;
    }
  }
}

/* Releases the workers a send failed to reach, after receive() has read what they sent before going. Lock held. */
static void release_unreachable(remote *r) {
  for (int i = 0; i < r->units->n_workers; i++) {
    if (!r->workers[i].unreachable) continue;
    r->workers[i].unreachable = false;
    if (live(r, i)) release_worker(r, i, "cannot be reached");
  }
}

static bool any_unreachable(const remote *r) {
  for (int i = 0; i < r->units->n_workers; i++)
    if (r->workers[i].unreachable) return true;
  return false;
}

static void *network_thread(void *arg) {
  remote *r = arg;
  double last_beat = 0;
  while (!atomic_load(&r->stop)) {
    zmq_pollitem_t items[3];
    int n = 0, socket_of[2];
    for (int s = 0; s < 2; s++)
      if (r->sockets[s]) {
        items[n] = (zmq_pollitem_t){.socket = sf_transport_socket(r->sockets[s]), .events = ZMQ_POLLIN};
        socket_of[n++] = s;
      }
    int wake_index = n;
    items[n++] = (zmq_pollitem_t){.fd = r->wake_fd, .events = ZMQ_POLLIN};
    long timeout_ms = (long)(r->heartbeat_interval * 1000 / 4);
    if (timeout_ms < 5) timeout_ms = 5;
    if (timeout_ms > 250) timeout_ms = 250;
    if (zmq_poll(items, n, timeout_ms) < 0 && zmq_errno() != EINTR) break;
    if (items[wake_index].revents & ZMQ_POLLIN) {
      uint64_t v;
      ssize_t got = read(r->wake_fd, &v, sizeof v);
      (void)got;
    }
    receive(r, items, socket_of, wake_index, false);
    pthread_mutex_lock(&r->lock);
    double now = now_seconds();
    housekeeping(r, now, &last_beat);
    hand_on_late_units(r, now);
    dispatch(r, now);
    bool unreachable = any_unreachable(r);
    pthread_mutex_unlock(&r->lock);
    if (unreachable) {
      receive(r, items, socket_of, wake_index, true);
      pthread_mutex_lock(&r->lock);
      release_unreachable(r);
      dispatch(r, now_seconds());
      pthread_mutex_unlock(&r->lock);
    }
    reap_children(r);
  }
  /* the end of the run: tell every worker */
  pthread_mutex_lock(&r->lock);
  for (int i = 0; i < r->units->n_workers; i++)
    if (live(r, i)) {
      sf_wire_message bye = {.type = SF_WIRE_BYE, .text = "the run is over"};
      send_to(r, &r->workers[i], &bye);
    }
  pthread_mutex_unlock(&r->lock);
  return NULL;
}

/* ---- local worker processes ---- */

static const char *worker_executable(remote *r) {
  if (r->worker_command[0]) return r->worker_command;
  static char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    const char *base = strrchr(self, '/');
    if (base && strcmp(base + 1, "shardflow") == 0) return self;
  }
  const char *env = getenv("SHARDFLOW_BIN");
  if (env && env[0]) return env;
  /* embedded (a Python trainer): the CLI next to libshardflow (a build tree) or in ../bin (an install) */
  Dl_info info;
  static char near[PATH_MAX];
  if (dladdr((void *)worker_executable, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
    const char *slash = strrchr(info.dli_fname, '/');
    int dir = (int)(slash - info.dli_fname);
    snprintf(near, sizeof near, "%.*s/shardflow", dir, info.dli_fname);
    if (access(near, X_OK) == 0) return near;
    snprintf(near, sizeof near, "%.*s/../bin/shardflow", dir, info.dli_fname);
    if (access(near, X_OK) == 0) return near;
  }
  return "shardflow";
}

/*
 * A worker loads only plugins it finds itself or was allowed by its command line, never a path a head
 * sends: the plugins this head loaded by path are passed to its own processes with --allow-plugin.
 * Returns the argv slots used from at (2 per plugin); *owned gets the strings to free.
 */
static int allow_plugins(const remote *r, char **argv, int at, char **owned) {
  int n = 0;
  for (int i = 0; r->stages && i < r->stages->n_plugins; i++) {
    const char *entry = r->stages->plugins[i].name;
    if (!strchr(entry, '/')) continue; /* a name: the worker searches the same SHARDFLOW_PLUGIN_PATH */
    /* absolute, but links unresolved: the worker matches the head's entry to it by file name */
    char cwd[PATH_MAX];
    if (entry[0] != '/' && getcwd(cwd, sizeof cwd) && asprintf(&owned[i], "%s/%s", cwd, entry) < 0) owned[i] = NULL;
    argv[at + n++] = (char *)"--allow-plugin";
    argv[at + n++] = owned[i] ? owned[i] : (char *)entry;
  }
  return n;
}

static int spawn_worker(remote *r, int index, sf_error *error) {
  const char *exe = worker_executable(r);
  char endpoint[128], name[64];
  snprintf(endpoint, sizeof endpoint, "ipc://%s", r->ipc_path);
  snprintf(name, sizeof name, "%s-local-%d", sf_node_name(r->node), index);
  char shm_fd[24] = "";
  int n_plugins = r->stages ? r->stages->n_plugins : 0;
  char **argv = calloc((size_t)(10 + 2 * n_plugins), sizeof *argv);
  char **owned = calloc((size_t)(n_plugins + 1), sizeof *owned);
  if (!argv || !owned) {
    free(argv);
    free(owned);
    return sf_error_set(error, SF_ENOMEM, SF_AT(.stage = sf_node_name(r->node)), "out of memory");
  }
  char *base[] = {(char *)"shardflow", (char *)"worker", (char *)"--connect", endpoint, (char *)"--name", name,
                  (char *)"--exit-with-parent"};
  int argc = (int)(sizeof base / sizeof *base);
  memcpy(argv, base, sizeof base);
  argc += allow_plugins(r, argv, argc, owned);
  /* a fresh ring for every process started: views of a dead one's ring keep that one mapped */
  sf_shm_ring_unref(&r->rings[index]);
  int fd = -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (r->shm_ring > 0) {
    sf_error e;
    if (sf_shm_ring_new((size_t)r->shm_ring, &r->rings[index], &fd, &e) < 0) {
      sf_log(SF_LOG_WARNING, sf_node_name(r->node), "%s; local worker %d sends its results through the socket",
             e.message, index);
    } else {
      posix_spawn_file_actions_adddup2(&actions, fd, fd); /* same number: clears close-on-exec in the child */
      snprintf(shm_fd, sizeof shm_fd, "%d", fd);
      argv[argc++] = (char *)"--shm-fd";
      argv[argc++] = shm_fd;
    }
  }
  pid_t pid;
  int rc = strchr(exe, '/') ? posix_spawn(&pid, exe, &actions, NULL, argv, environ)
                            : posix_spawnp(&pid, exe, &actions, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  for (int i = 0; i < n_plugins; i++) free(owned[i]);
  free(owned);
  free(argv);
  if (fd >= 0) close(fd);
  if (rc != 0)
    return sf_error_set(error, SF_ENOENT, SF_AT(.stage = sf_node_name(r->node)),
                        "cannot start worker process '%s': %s; set the group's worker_command or SHARDFLOW_BIN to the "
                        "shardflow executable",
                        exe, strerror(rc));
  r->children[index] = pid;
  return 0;
}

static void describe_exit(int status, char *out, size_t size) {
  if (WIFSIGNALED(status)) snprintf(out, size, "was killed by signal %d", WTERMSIG(status));
  else snprintf(out, size, "exited with status %d", WEXITSTATUS(status));
}

/*
 * The last local worker ended for good.  With no listen: endpoint no other worker can ever join, so the
 * run fails now rather than wait for ever (worker_timeout 0) with work left.
 */
static void no_local_worker_left(remote *r, const char *how) {
  if (r->listen[0]) return;
  for (int i = 0; i < r->n_children; i++)
    if (r->children[i] > 0) return;
  pthread_mutex_lock(&r->lock);
  bool work_left = !r->input_done || r->units->count > 0 || r->n_open > 0;
  if (work_left) {
    sf_error e;
    sf_error_set(&e, SF_EIO, SF_AT(.stage = sf_node_name(r->node)),
                 "every local worker process ended and none is restarted after %d restarts (the last %s), and "
                 "without `listen:` no other worker can join: see the workers' messages above; check the group's "
                 "worker_command (or SHARDFLOW_BIN) runs `shardflow worker`",
                 r->respawns, how);
    fail_run(r, &e);
  }
  pthread_mutex_unlock(&r->lock);
}

/* Local workers that died are started again (a few times): the group keeps its processes. */
static void reap_children(remote *r) {
  for (int i = 0; i < r->n_children; i++) {
    if (r->children[i] <= 0) continue;
    int status;
    pid_t p = waitpid(r->children[i], &status, WNOHANG);
    if (p != r->children[i]) continue;
    r->children[i] = 0;
    if (atomic_load(&r->stop)) continue;
    char how[64];
    describe_exit(status, how, sizeof how);
    if (r->respawns >= 3 * r->n_children) {
      sf_log(SF_LOG_WARNING, sf_node_name(r->node), "local worker %d %s and is not restarted (%d restarts used)", i, how, r->respawns);
      no_local_worker_left(r, how);
      continue;
    }
    r->respawns++;
    sf_log(SF_LOG_WARNING, sf_node_name(r->node), "local worker %d %s; starting another", i, how);
    sf_error e;
    if (spawn_worker(r, i, &e) < 0) {
      sf_log(SF_LOG_WARNING, sf_node_name(r->node), "%s", e.message);
      no_local_worker_left(r, how);
    }
  }
}

/* ---- the stage ---- */

/* An init failure: the engine reports only the message, so it must name the endpoint or key file itself. */
static int start_error(sf_node *node, sf_error *e, int rc) {
  if (e->url[0] && !strstr(e->message, e->url)) {
    char message[sizeof e->url + sizeof e->message + 4];
    int n = snprintf(message, sizeof message, "%s: %s", e->url, e->message);
    size_t keep = n < 0 ? 0 : (size_t)n < sizeof e->message ? (size_t)n : sizeof e->message - 1;
    memcpy(e->message, message, keep);
    e->message[keep] = '\0';
  }
  snprintf(e->stage, sizeof e->stage, "%s", sf_node_name(node));
  sf_context_record(node->ctx, e);
  return rc;
}

/* The group's counters for /metrics and the bottleneck report (sf_node_extra); any thread. */
static void describe(sf_node *node, sf_node_extra *x) {
  sf_remote_stats *st = malloc(sizeof *st); /* large: a table per worker */
  if (!st) return;
  sf_remote_describe(node, st);
  x->group = true;
  x->workers = (uint64_t)st->live;
  x->reassigned = st->reassigned;
  x->duplicates = st->duplicates;
  free(st);
}

static int init(sf_node *node) {
  remote *r = sf_node_priv(node);
  r->node = node;
  r->wake_fd = -1;
  pthread_mutex_init(&r->lock, NULL);
  node->extra = describe;
  atomic_init(&r->stop, false);
  sf_error e;
  if (!(r->stages = sf_node_group_stages(node))) {
    sf_node_error(node, SF_EINVAL, NULL, NULL, -1, "a _remote node is made by the engine from `groups:`");
    return SF_EINVAL;
  }
  if (r->processes == 0 && !r->listen[0]) {
    sf_node_error(node, SF_EOPTION, NULL, NULL, -1,
                  "group '%s' has neither `processes:` nor `listen:`: nothing would run its stages", sf_node_name(node));
    return SF_EOPTION;
  }
  sf_unit_window_new(r->window, r->buffer_size, r->unit_samples, MAX_WORKERS, &r->units);
  r->open = calloc((size_t)r->unit_samples, sizeof *r->open);
  r->children = calloc((size_t)(r->processes ? r->processes : 1), sizeof *r->children);
  r->rings = calloc((size_t)(r->processes ? r->processes : 1), sizeof *r->rings);
  r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  r->last_wait_log = now_seconds(); /* the first "waiting" line after 10 s, not at start */
  r->zctx = zmq_ctx_new();
  if (r->zctx) zmq_ctx_set(r->zctx, ZMQ_IO_THREADS, (int)r->io_threads);
  if (!r->units || !r->open || !r->children || !r->rings || r->wake_fd < 0 || !r->zctx) {
    sf_node_error(node, SF_ENOMEM, NULL, NULL, -1, "out of memory");
    return SF_ENOMEM;
  }
  sf_transport_options t = {.max_message_bytes = r->max_message};
  if (r->listen[0]) {
    t.endpoint = r->listen;
    t.secret_key_file = r->secret_key[0] ? r->secret_key : NULL;
    t.allowed_keys = r->allowed_keys[0] ? r->allowed_keys : NULL;
    t.plaintext = r->plaintext;
    int rc = sf_transport_listen(r->zctx, &t, &r->sockets[0], &e);
    if (rc == 0 && r->rendezvous[0])
      rc = sf_rendezvous_write(r->rendezvous, sf_transport_endpoint(r->sockets[0]),
                               t.plaintext ? NULL : t.secret_key_file, &e);
    if (rc < 0) return start_error(node, &e, rc);
    r->wrote_rendezvous = r->rendezvous[0] != '\0';
  } else if (r->rendezvous[0]) {
    sf_node_error(node, SF_EOPTION, NULL, NULL, -1,
                  "group '%s': rendezvous: needs listen: (the endpoint the file tells workers), "
                  "e.g. listen: tcp://0.0.0.0:0",
                  sf_node_name(node));
    return SF_EOPTION;
  }
  if (r->processes > 0) {
    const char *tmp = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
    /* of heads that were killed: their directories, and the sockets older versions put in tmp itself */
    sf_remove_stale_files(tmp, "shardflow-", "", S_IFDIR);
    sf_remove_stale_files(tmp, "shardflow-", ".ipc", S_IFSOCK);
    /*
     * A directory of its own: two pipelines of one process with the same group name (train and validation)
     * get two sockets, and only this user can reach them (ipc:// has no CURVE; the socket's directory is
     * what keeps other local users out).
     */
    int n = snprintf(r->ipc_dir, sizeof r->ipc_dir, "%s/shardflow-%d-XXXXXX", tmp, (int)getpid());
    if (n < 0 || (size_t)n + sizeof "/local.ipc" > sizeof r->ipc_dir || !mkdtemp(r->ipc_dir)) {
      int err = errno;
      bool long_path = n < 0 || (size_t)n + sizeof "/local.ipc" > sizeof r->ipc_dir;
      r->ipc_dir[0] = '\0';
      sf_node_error(node, SF_EIO, NULL, NULL, -1,
                    "group '%s': cannot make a directory for the local workers' socket in %s: %s; set TMPDIR to a "
                    "short, writable directory",
                    sf_node_name(node), tmp, long_path ? "the path is too long for a unix socket" : strerror(err));
      return SF_EIO;
    }
    snprintf(r->ipc_path, sizeof r->ipc_path, "%s/local.ipc", r->ipc_dir);
    char endpoint[128];
    snprintf(endpoint, sizeof endpoint, "ipc://%s", r->ipc_path);
    sf_transport_options local = {.endpoint = endpoint, .max_message_bytes = r->max_message};
    int rc = sf_transport_listen(r->zctx, &local, &r->sockets[1], &e);
    if (rc < 0) return start_error(node, &e, rc);
    r->n_children = (int)r->processes;
    for (int i = 0; i < r->n_children; i++) {
      rc = spawn_worker(r, i, &e);
      if (rc < 0) return start_error(node, &e, rc);
    }
  }
  if (pthread_create(&r->thread, NULL, network_thread, r) != 0) {
    sf_node_error(node, SF_ENOMEM, NULL, NULL, -1, "cannot start the network thread");
    return SF_ENOMEM;
  }
  r->thread_started = true;
  return 0;
}

/* Moves the open unit into the window. Called with the lock held and a free slot. */
static void close_open_unit(remote *r) {
  if (r->n_open == 0) return;
  if (sf_unit_window_add(r->units, r->open, r->n_open) < 0) return; /* the samples stay open; the next step tries again */
  r->n_open = 0;
}

/* Takes input into units while the window has room. Returns true when anything changed. */
static bool take_input(remote *r, bool *closed) {
  bool progress = false;
  int window = sf_unit_window_limit(r->units);
  while (!r->input_done && r->units->count < window) {
    if (r->n_open == r->unit_samples) {
      close_open_unit(r); /* a unit that could not close (out of memory) stays full: take nothing more */
      if (r->n_open) break;
      *closed = true;
      continue;
    }
    sf_item item;
    int rc = sf_node_pop(r->node, &item);
    if (rc == SF_EAGAIN) {
      /* nothing more now: hand out a partial unit rather than let workers idle */
      if (r->n_open && !sf_unit_window_has_pending(r->units)) {
        close_open_unit(r);
        *closed = true;
      }
      break;
    }
    progress = true;
    if (rc == SF_EOF) {
      close_open_unit(r);
      *closed = true;
      r->input_done = true;
      break;
    }
    if (item.kind == SF_ITEM_EPOCH_END) {
      close_open_unit(r);
      sf_unit_window_add_marker(r->units, item.epoch);
      *closed = true;
      continue;
    }
    if (item.kind != SF_ITEM_SAMPLE) {
      sf_item_clear(&item);
      continue;
    }
    sf_sample *s = item.u.sample;
    if (r->n_open > 0) {
      const sf_sample *first = r->open[0];
      if (r->n_open == r->unit_samples || first->shard_index != s->shard_index || first->epoch != s->epoch ||
          first->pass != s->pass) {
        close_open_unit(r);
        *closed = true;
        if (r->n_open) { /* out of memory: the sample has nowhere to go */
          sf_node_error(r->node, SF_ENOMEM, sf_sample_url(s), s->key, s->offset, "out of memory forming a work unit");
          sf_node_count_skipped(r->node, 1);
          sf_sample_destroy(&s);
          break;
        }
        if (r->units->count >= window) {
          /* no room for the next unit yet: keep this sample open on its own */
          r->open[r->n_open++] = s;
          break;
        }
      }
    }
    r->open[r->n_open++] = s;
    if (r->n_open == r->unit_samples) {
      close_open_unit(r);
      *closed = true;
    }
  }
  return progress;
}

/* Passes finished units on, in order. Returns true when anything was pushed. */
static bool deliver(remote *r) {
  bool progress = false;
  while (r->units->count > 0 && sf_node_output_ready(r->node)) {
    sf_unit *u = sf_unit_window_at(r->units, 0);
    if (u->state == SF_UNIT_MARKER) {
      sf_item item = {.kind = SF_ITEM_EPOCH_END, .epoch = u->epoch};
      sf_node_push(r->node, &item);
      r->epochs_ended = u->epoch + 1;
    } else if (u->state == SF_UNIT_DONE) {
      if (u->next_out < u->n_out) {
        sf_sample *s = u->out[u->next_out];
        u->out[u->next_out++] = NULL;
        uint64_t bytes = 0;
        for (int f = 0; f < s->n_fields; f++) bytes += sf_tensor_nbytes(&s->fields[f].tensor);
        sf_node_count_output(r->node, 1, bytes);
        sf_item item = {.kind = SF_ITEM_SAMPLE, .epoch = s->epoch, .u.sample = s};
        sf_node_push(r->node, &item);
        progress = true;
        if (u->next_out < u->n_out) continue;
      }
    } else {
      break;
    }
    sf_unit_window_pop(r->units);
    progress = true;
  }
  return progress;
}

static int step(sf_node *node) {
  remote *r = sf_node_priv(node);
  pthread_mutex_lock(&r->lock);
  if (r->failed) {
    if (r->failure_pending) sf_node_error_record(node, &r->failure);
    r->failure_pending = false;
    int rc = r->failed;
    pthread_mutex_unlock(&r->lock);
    return rc;
  }
  bool closed = false;
  bool progress = take_input(r, &closed);
  progress |= deliver(r);
  bool finished = r->input_done && r->units->count == 0 && r->n_open == 0;
  pthread_mutex_unlock(&r->lock);
  if (closed) wake_thread(r);
  if (finished) return SF_EOF;
  return progress ? 0 : SF_EAGAIN;
}

static void uninit(sf_node *node) {
  remote *r = sf_node_priv(node);
  if (!r->node) return;
  atomic_store(&r->stop, true);
  if (r->thread_started) {
    wake_thread(r);
    pthread_join(r->thread, NULL);
  }
  for (int i = 0; i < r->n_children; i++)
    if (r->children[i] > 0) kill(r->children[i], SIGTERM);
  for (int i = 0; i < r->n_children; i++)
    if (r->children[i] > 0) waitpid(r->children[i], NULL, 0);
  for (int s = 0; s < 2; s++) sf_transport_close(&r->sockets[s]);
  if (r->zctx) zmq_ctx_term(r->zctx);
  if (r->ipc_path[0]) unlink(r->ipc_path);
  if (r->ipc_dir[0]) rmdir(r->ipc_dir);
  if (r->wrote_rendezvous) unlink(r->rendezvous); /* workers of a later run must not find this head */
  if (r->processes > 0 && r->shm_ring > 0)
    sf_log(SF_LOG_INFO, sf_node_name(r->node), "results: %llu bytes through shared memory, %llu through the socket",
           (unsigned long long)r->ring_bytes, (unsigned long long)r->socket_bytes);
  if (r->units)
    for (int i = 0; i < r->units->n_workers; i++) sf_shm_ring_unref(&r->workers[i].ring);
  sf_unit_window_destroy(&r->units);
  for (int i = 0; i < r->n_open; i++) sf_sample_destroy(&r->open[i]);
  free(r->open);
  free(r->children);
  for (int i = 0; r->rings && i < r->n_children; i++) sf_shm_ring_unref(&r->rings[i]);
  free(r->rings);
  if (r->wake_fd >= 0) close(r->wake_fd);
  pthread_mutex_destroy(&r->lock);
}

int sf_remote_describe(sf_node *node, sf_remote_stats *stats) {
  remote *r = sf_node_priv(node);
  memset(stats, 0, sizeof *stats);
  pthread_mutex_lock(&r->lock);
  int n_workers = r->units ? r->units->n_workers : 0;
  for (int i = 0; i < n_workers && stats->n_workers < SF_REMOTE_MAX_REPORTED; i++) {
    worker *w = &r->workers[i];
    if (live(r, i)) stats->live++;
    sf_remote_worker_stats *o = &stats->workers[stats->n_workers++];
    snprintf(o->name, sizeof o->name, "%s", w->name);
    o->pid = w->pid;
    o->live = live(r, i);
    o->samples = w->samples;
    o->units = w->units;
    o->rate = live(r, i) ? w->rate : 0;
    o->n_stats = w->n_stats;
    memcpy(o->stats, w->stats, (size_t)w->n_stats * sizeof *o->stats);
  }
  stats->duplicates = r->units ? r->units->duplicates : 0;
  stats->malformed = r->malformed;
  stats->reassigned = r->units ? r->units->reassigned : 0;
  stats->ring_bytes = r->ring_bytes;
  stats->socket_bytes = r->socket_bytes;
  stats->refused = 0;
  for (int s = 0; s < 2; s++)
    if (r->sockets[s]) stats->refused += sf_transport_refused(r->sockets[s]);
  pthread_mutex_unlock(&r->lock);
  return 0;
}

const sf_stage_def sf_stage_remote = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "_remote",
    .summary = "a group's stages running in worker processes (made by the engine from `groups:`)",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(remote),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
};
