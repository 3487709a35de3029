/*
 * A group's head: the network thread.  It owns the sockets: it answers HELLO with the group's stages,
 * dispatches units to workers as they give credit, takes RESULTs, sends heartbeats, declares a silent
 * worker dead and gives its units to others; a RESULT for a unit already finished is a duplicate and is
 * dropped.  A unit held far longer than units take (SF_UNIT_LATE_FACTOR times the observed time) goes
 * to another worker too: a worker that heartbeats but never answers does not stall the epoch.
 * engine/group/head.h says what the head's files share; docs/protocol.md has the message sequence.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "head.h"
#include "log.h"

void sf_head_wake(sf_head *r) {
  uint64_t one = 1;
  ssize_t n = write(r->wake_fd, &one, sizeof one);
  (void)n;
}

static int send_to(sf_head *r, sf_head_worker *w, sf_wire_message *m) {
  m->peer = w->peer;
  if (w->ring && (m->type == SF_WIRE_UNIT || m->type == SF_WIRE_HEARTBEAT)) m->shm_freed = sf_shm_ring_freed(w->ring);
  sf_error e;
  int rc = sf_wire_send(sf_transport_socket(r->sockets[w->socket]), m, ZMQ_DONTWAIT, &e);
  if (rc == 0 && m->shm_freed) w->freed_sent = m->shm_freed;
  return rc;
}

/* Gives a worker's units back to the queue (it died or left). Called with the lock held. */
static void release_worker(sf_head *r, int wi, const char *why) {
  sf_head_worker *w = &r->workers[wi];
  int requeued = sf_unit_window_leave(r->units, wi);
  if (requeued < 0) return;
  sf_log(SF_LOG_WARNING, sf_node_name(r->node), "worker %s (pid %lld) %s; %d unit%s handed to other workers", w->name, (long long)w->pid, why, requeued,
           requeued == 1 ? "" : "s");
}

static int find_worker(sf_head *r, int socket, const sf_wire_peer *peer) {
  for (int i = 0; i < r->units->n_workers; i++) {
    sf_head_worker *w = &r->workers[i];
    if (sf_head_live(r, i) && w->socket == socket && w->peer.len == peer->len && memcmp(w->peer.id, peer->id, peer->len) == 0)
      return i;
  }
  return -1;
}

static void on_hello(sf_head *r, int socket, sf_wire_message *m, double now) {
  int old = find_worker(r, socket, &m->peer);
  if (old >= 0) release_worker(r, old, "said hello again");
  int wi = sf_unit_window_join(r->units);
  if (wi < 0) return;
  sf_head_worker *w = &r->workers[wi];
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

static void on_result(sf_head *r, int wi, sf_wire_message *m, double now) {
  sf_head_worker *w = wi >= 0 ? &r->workers[wi] : NULL;
  sf_unit *u;
  sf_unit_answer answer = sf_unit_window_result(r->units, wi, m->unit, m->samples, m->n_samples, now, &u);
  r->ring_bytes += m->ring_bytes;
  r->socket_bytes += m->frame_bytes;
  if (answer == SF_UNIT_FOREIGN) {
    r->malformed++;
    if (r->logged++ < SF_HEAD_MAX_LOGGED)
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

static void handle(sf_head *r, int socket, sf_wire_message *m, double now) {
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
  sf_head_worker *w = &r->workers[wi];
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
static void hand_on_late_units(sf_head *r, double now) {
  sf_unit *u;
  while ((u = sf_unit_window_next_late(r->units, now)) != NULL)
    if (r->logged++ < SF_HEAD_MAX_LOGGED)
      sf_log(SF_LOG_WARNING, sf_node_name(r->node), "unit %llu is late: %.1f s at worker %s while units take %.3f s; handed to another worker too",
               (unsigned long long)u->id, now - u->sent_at, r->workers[u->worker].name, r->units->unit_seconds);
}

/* Sends pending units, oldest first, to live workers with credit. Called with the lock held. */
static void dispatch(sf_head *r, double now) {
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
    sf_head_worker *w = &r->workers[chosen];
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


/* Heartbeats out, silent workers declared dead, the no-worker timeout. Called with the lock held. */
static void housekeeping(sf_head *r, double now, double *last_beat) {
  if (r->epochs_announced < r->epochs_ended) {
    r->epochs_announced = r->epochs_ended;
    for (int i = 0; i < r->units->n_workers; i++)
      if (sf_head_live(r, i)) {
        sf_wire_message end = {.type = SF_WIRE_EPOCH_END, .epoch = r->epochs_ended - 1};
        send_to(r, &r->workers[i], &end);
      }
  }
  if (now - *last_beat >= r->heartbeat_interval) {
    *last_beat = now;
    for (int i = 0; i < r->units->n_workers; i++) {
      sf_head_worker *w = &r->workers[i];
      if (!sf_head_live(r, i)) continue;
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
    sf_head_worker *w = &r->workers[i];
    if (sf_head_live(r, i) && w->ring && sf_shm_ring_freed(w->ring) - w->freed_sent >= sf_shm_ring_size(w->ring) / 4) {
      sf_wire_message hb = {.type = SF_WIRE_HEARTBEAT};
      send_to(r, w, &hb);
    }
  }
  int n_live = 0;
  for (int i = 0; i < r->units->n_workers; i++) {
    sf_head_worker *w = &r->workers[i];
    if (!sf_head_live(r, i)) continue;
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
    sf_head_fail(r, &e);
  } else if (now - r->last_wait_log >= 10) {
    r->last_wait_log = now;
    sf_log(SF_LOG_WARNING, sf_node_name(r->node), "waiting for workers: none alive for %.0f s%s", waited,
             r->listen[0] ? "; they connect to the group's listen endpoint" : "");
  }
}

/* sf_wire_ring_fn for the local socket: the ring of the process that sent a message (alive or declared dead). */
static sf_shm_ring *ring_of(void *opaque, const sf_wire_peer *peer) {
  sf_head *r = opaque;
  sf_shm_ring *ring = NULL;
  pthread_mutex_lock(&r->lock);
  for (int i = r->units->n_workers - 1; i >= 0 && !ring; i--) {
    sf_head_worker *w = &r->workers[i];
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
static void receive(sf_head *r, zmq_pollitem_t *items, const int *socket_of, int n, bool all) {
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
        handle(r, socket_of[k], &m, sf_head_now());
      } else if (rc == SF_EFORMAT || rc == SF_ETOOBIG) {
        r->malformed++;
        if (r->logged++ < SF_HEAD_MAX_LOGGED) sf_log(SF_LOG_WARNING, sf_node_name(r->node), "dropped a malformed message: %s", e.message);
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
static void release_unreachable(sf_head *r) {
  for (int i = 0; i < r->units->n_workers; i++) {
    if (!r->workers[i].unreachable) continue;
    r->workers[i].unreachable = false;
    if (sf_head_live(r, i)) release_worker(r, i, "cannot be reached");
  }
}

static bool any_unreachable(const sf_head *r) {
  for (int i = 0; i < r->units->n_workers; i++)
    if (r->workers[i].unreachable) return true;
  return false;
}

void *sf_head_network_thread(void *arg) {
  sf_head *r = arg;
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
    double now = sf_head_now();
    housekeeping(r, now, &last_beat);
    hand_on_late_units(r, now);
    dispatch(r, now);
    bool unreachable = any_unreachable(r);
    pthread_mutex_unlock(&r->lock);
    if (unreachable) {
      receive(r, items, socket_of, wake_index, true);
      pthread_mutex_lock(&r->lock);
      release_unreachable(r);
      dispatch(r, sf_head_now());
      pthread_mutex_unlock(&r->lock);
    }
    sf_head_reap_children(r);
  }
  /* the end of the run: tell every worker */
  pthread_mutex_lock(&r->lock);
  for (int i = 0; i < r->units->n_workers; i++)
    if (sf_head_live(r, i)) {
      sf_wire_message bye = {.type = SF_WIRE_BYE, .text = "the run is over"};
      send_to(r, &r->workers[i], &bye);
    }
  pthread_mutex_unlock(&r->lock);
  return NULL;
}
