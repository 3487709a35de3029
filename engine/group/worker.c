/*
 * The worker's side of a group: a network loop on the main thread (this file), and a pipeline
 * _worker_source -> the group's stages -> _worker_sink on the pool (worker_stages.c: how a unit goes
 * through and when it is done).  A unit counts as running from its first sample on: a unit larger than
 * the queues reaches the sink before its last samples leave the source.
 *
 * A worker may serve several heads (every rank of a job: `--connect` given
 * once per head).  Each head has its own connection, WELCOME, stages and
 * pipeline; the two stages find their head's state (worker_state.h) in their
 * private struct, handed over while the network loop builds that pipeline.  Each
 * head is credited `credits` units (its queue here); the decode slots
 * (`credits` units running at once over all heads) go one unit at a time,
 * round robin, to the heads with units waiting, so heads with work share
 * the CPUs evenly.  A head that ends or
 * falls silent frees its slots; one that appears later joins then.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "graph_groups.h"
#include "log.h"
#include "node.h"
#include "plugin_loader.h"
#include "group.h"
#include "transport.h"
#include "wire.h"
#include "worker.h"
#include "worker_state.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the network loop ---- */

static void on_record(void *opaque, const sf_error *e) {
  sf_worker_state *w = opaque;
  /* called under the context's error lock, never under w->lock's holders' feet: take w->lock briefly */
  pthread_mutex_lock(&w->lock);
  if (w->n_errors < SF_WORKER_MAX_PENDING_ERRORS) w->errors[w->n_errors++] = *e;
  else w->errors_dropped++;
  pthread_mutex_unlock(&w->lock);
}

static int collect_stats(sf_pipeline *p, sf_wire_stage_stats *out) {
  sf_node_stats *st = malloc(SF_WIRE_MAX_STATS * sizeof *st); /* large (a row per input port): not on the stack */
  if (!st) return 0; /* the table is for people: out of memory, the message goes without it */
  int n = sf_pipeline_stats(p, st, SF_WIRE_MAX_STATS);
  if (n > SF_WIRE_MAX_STATS) n = SF_WIRE_MAX_STATS;
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (st[i].type[0] == '_') continue; /* the worker's own ends are not the user's stages */
    sf_wire_stage_stats *s = &out[k++];
    memset(s, 0, sizeof *s);
    memcpy(s->name, st[i].name, sizeof s->name);
    s->name[sizeof s->name - 1] = '\0';
    s->items = st[i].items;
    s->bytes = st[i].bytes;
    s->busy_ns = (uint64_t)(st[i].busy_seconds * 1e9);
    s->wait_ns = (uint64_t)(st[i].wait_seconds * 1e9);
    s->errors = st[i].errors;
  }
  free(st);
  return k;
}

/* Sends every finished unit's result; adds the units sent to *units and their input samples to *samples. */
static int send_results(sf_worker_state *w, void *socket, sf_shm_ring *ring, sf_pipeline *p, int *units,
                        int64_t *samples, sf_error *error) {
  for (;;) {
    pthread_mutex_lock(&w->lock);
    sf_worker_unit *u = sf_worker_unit_take(&w->outbox, &w->outbox_tail);
    sf_error errors[SF_WORKER_MAX_PENDING_ERRORS];
    int n_errors = w->n_errors;
    memcpy(errors, w->errors, (size_t)n_errors * sizeof *errors);
    if (u) w->n_errors = 0;
    pthread_mutex_unlock(&w->lock);
    if (!u) return 0;
    /* A unit's drops are filtered (on purpose) or skipped (errors); the stages count the first in total, so
     * a unit takes what was filtered since the last result, up to its own drops: the totals stay exact. */
    sf_node_stats st[SF_WIRE_MAX_STATS];
    uint64_t filtered = 0, drops = (uint64_t)(u->n_in - u->n_out);
    int n_st = sf_pipeline_stats(p, st, SF_WIRE_MAX_STATS);
    for (int i = 0; i < n_st && i < SF_WIRE_MAX_STATS; i++) filtered += st[i].filtered;
    filtered -= w->filtered_sent;
    if (filtered > drops) filtered = drops;
    w->filtered_sent += filtered;
    sf_wire_stage_stats stats[SF_WIRE_MAX_STATS];
    sf_wire_message m = {
        .type = SF_WIRE_RESULT,
        .unit = u->id,
        .samples = u->out,
        .n_samples = u->n_out,
        .samples_in = (uint64_t)u->n_in,
        .skipped = drops - filtered,
        .filtered = filtered,
        .errors = errors,
        .n_errors = n_errors,
        .stats = stats,
        .n_stats = collect_stats(p, stats),
        .shm = ring,
    };
    int rc = sf_wire_send(socket, &m, 0, error);
    (*units)++;
    *samples += u->n_in;
    sf_worker_unit_free(u);
    if (rc < 0) return rc;
  }
}

/* One head this worker serves: its connection and, once welcomed, its own stages' pipeline. */
typedef enum { HEAD_JOINING, HEAD_SERVING, HEAD_ENDED } head_phase;

typedef struct head {
  const char *endpoint;
  head_phase phase;
  sf_transport *transport;
  void *socket;
  sf_wire_message welcome;
  sf_graph *graph;
  sf_pipeline *pipeline;
  sf_worker_state state;              /* shared with the pipeline's threads under state.lock */
  sf_worker_unit *queued, *queued_tail;     /* received, waiting for a decode slot (network thread only) */
  int released;                    /* units given a slot whose result is not sent yet */
  double deadline, last_heard, last_beat, interval, timeout;
  uint64_t units_served, samples_served;
  uint64_t contended;              /* units given a slot while another head had units waiting too */
  sf_shm_ring *ring;               /* the ring a head that started this process shares with it, or NULL */
  int rc;                          /* how it ended: 0 (BYE) or an error, in error */
  sf_error error;
} head;

static void receive_unit(head *h, sf_wire_message *m, const char *name) {
  sf_worker_unit *u = calloc(1, sizeof *u);
  if (u) u->in = calloc((size_t)(m->n_samples ? m->n_samples : 1), sizeof *u->in);
  if (!u || !u->in) {
    free(u);
    sf_log(SF_LOG_WARNING | SF_LOG_UNPREFIXED, NULL,
           "shardflow worker %s: out of memory: unit %llu of %s dropped (the head will resend it)", name,
           (unsigned long long)m->unit, h->endpoint);
    return;
  }
  u->id = m->unit;
  u->n_in = m->n_samples;
  for (int i = 0; i < m->n_samples; i++) {
    u->in[i] = m->samples[i];
    m->samples[i] = NULL;
  }
  sf_worker_unit_append(&h->queued, &h->queued_tail, u);
}

/*
 * Gives free decode slots (at most `slots` units running over all heads) one unit at a time to the heads
 * with units waiting, round robin from *rr.
 */
static void dispatch(head *heads, int n, int slots, int *rr) {
  int busy = 0;
  for (int i = 0; i < n; i++) busy += heads[i].released;
  while (busy < slots) {
    int pick = -1;
    for (int k = 0; k < n; k++) {
      int i = (*rr + k) % n;
      if (heads[i].phase == HEAD_SERVING && heads[i].queued) {
        pick = i;
        break;
      }
    }
    if (pick < 0) return;
    head *h = &heads[pick];
    for (int i = 0; i < n; i++)
      if (i != pick && heads[i].phase == HEAD_SERVING && heads[i].queued) {
        h->contended++;
        break;
      }
    *rr = (pick + 1) % n;
    sf_worker_unit *u = sf_worker_unit_take(&h->queued, &h->queued_tail);
    h->released++;
    busy++;
    pthread_mutex_lock(&h->state.lock);
    sf_worker_unit_append(&h->state.inbox, &h->state.inbox_tail, u);
    pthread_mutex_unlock(&h->state.lock);
    sf_node_notify(h->state.source);
  }
}

/* The file name an entry names, into out[size]: its last path component without ".so"; false if there is none. */
static bool plugin_file_name(const char *entry, char *out, size_t size) {
  const char *slash = strrchr(entry, '/');
  const char *base = slash ? slash + 1 : entry;
  size_t n = strlen(base);
  if (slash && n > 3 && strcmp(base + n - 3, ".so") == 0) n -= 3;
  if (n == 0 || n >= size || base[0] == '.') return false;
  memcpy(out, base, n);
  out[n] = '\0';
  return true;
}

/*
 * The plugin a head's entry names, as this worker may load it: a file it was started with (--allow-plugin)
 * of that file name, else NAME.so searched in its own plugin path. Never the head's path: whoever controls
 * a head (or the rendezvous file that leads to one) would otherwise run code on every worker.
 */
static int load_plugin(const sf_worker_options *o, const char *entry, const sf_plugin **p, sf_error *why) {
  char name[256], allowed[256];
  if (!plugin_file_name(entry, name, sizeof name))
    return sf_error_set(why, SF_EINVAL, SF_AT(.url = entry), "'%s' names no plugin file", entry);
  for (int j = 0; j < o->n_allowed_plugins; j++)
    if (plugin_file_name(o->allowed_plugins[j], allowed, sizeof allowed) && strcmp(allowed, name) == 0)
      return sf_plugin_load(o->allowed_plugins[j], p, why);
  int rc = sf_plugin_load(name, p, why);
  if (rc == SF_ENOENT) {
    size_t n = strlen(why->message);
    snprintf(why->message + n, sizeof why->message - n,
             " (a worker loads plugins by file name from its own path, or a file given with --allow-plugin)");
  }
  return rc;
}

/*
 * Loads the plugins the head's WELCOME names for the group's stages and checks they are the head's
 * builds; on a refusal tells the head with a BYE naming the plugin, and returns the error.
 */
static int load_plugins(void *socket, const sf_worker_options *o, const sf_graph *stages, const char *name,
                        sf_error *error) {
  for (int i = 0; stages && i < stages->n_plugins; i++) {
    const sf_graph_plugin *want = &stages->plugins[i];
    const sf_plugin *p;
    sf_error why = {0};
    int rc = load_plugin(o, want->name, &p, &why);
    if (rc == 0 && want->build_id && strcmp(p->build_id, want->build_id) != 0)
      rc = sf_error_set(&why, SF_EUNSUPPORTED, SF_AT(.url = want->name),
                        "plugin '%s' here is build '%s', the head's is build '%s': install the head's build", p->name,
                        p->build_id, want->build_id);
    if (rc < 0) {
      sf_error_set(error, rc, SF_AT(.url = stages->path, .line = want->line),
                   "worker %s cannot run the group: plugin %s (build %s) from line %lld of the head's graph: %s",
                   name, want->name, want->build_id ? want->build_id : "?", (long long)want->line, why.message);
      sf_wire_message bye = {.type = SF_WIRE_BYE, .text = error->message};
      sf_error ignored;
      sf_wire_send(socket, &bye, 0, &ignored);
      return rc;
    }
  }
  return 0;
}


/* Connects to a head and says HELLO; the DEALER queues it until the head is there. */
static int connect_head(head *h, void *zctx, const sf_worker_options *o, int index, const char *name,
                        sf_error *error) {
  const char *server_key = o->n_server_keys == 1 ? o->server_key_files[0]
                           : index < o->n_server_keys ? o->server_key_files[index]
                                                      : NULL;
  sf_transport_options t = {.endpoint = h->endpoint, .secret_key_file = o->secret_key_file,
                            .server_key_file = server_key, .plaintext = o->plaintext};
  int rc = sf_transport_connect(zctx, &t, &h->transport, error);
  if (rc < 0) return rc;
  h->socket = sf_transport_socket(h->transport);
  sf_wire_message hello = {.type = SF_WIRE_HELLO, .text = (char *)name, .pid = getpid(),
                           .threads = (uint32_t)(o->threads > 0 ? o->threads : sysconf(_SC_NPROCESSORS_ONLN))};
  h->phase = HEAD_JOINING;
  h->deadline = now_seconds() + (o->connect_timeout > 0 ? o->connect_timeout : 60);
  return sf_wire_send(h->socket, &hello, 0, error);
}

/* Ends a head's service: its pipeline, its units (the head hands unfinished ones to others) and its slots. */
static void end_head(head *h, int rc, const sf_error *why, const char *name, bool quiet) {
  if (h->phase == HEAD_ENDED) return;
  if (!quiet || rc < 0)
    sf_log((rc < 0 ? SF_LOG_WARNING : SF_LOG_INFO) | SF_LOG_UNPREFIXED, NULL,
           "shardflow worker %s: left %s: served %llu units, %llu samples (%llu units while another head "
           "waited)%s%s", name, h->endpoint, (unsigned long long)h->units_served,
           (unsigned long long)h->samples_served, (unsigned long long)h->contended, rc < 0 ? ": " : "",
           rc < 0 && why ? why->message : "");
  h->phase = HEAD_ENDED;
  h->rc = rc;
  if (rc < 0 && why) h->error = *why;
  pthread_mutex_lock(&h->state.lock);
  h->state.stopping = true;
  pthread_mutex_unlock(&h->state.lock);
  if (h->state.source) sf_node_notify(h->state.source);
  sf_pipeline_destroy(&h->pipeline);
  sf_wire_message_clear(&h->welcome);
  sf_graph_destroy(&h->graph);
  sf_transport_close(&h->transport);
  sf_worker_unit_free_list(h->queued);
  sf_worker_unit_free_list(h->state.inbox);
  sf_worker_unit_free_list(h->state.running);
  sf_worker_unit_free_list(h->state.outbox);
  h->queued = h->queued_tail = h->state.inbox = h->state.inbox_tail = NULL;
  h->state.running = h->state.running_tail = h->state.outbox = h->state.outbox_tail = h->state.feeding = NULL;
  h->released = 0;
}

/* After the head's WELCOME: builds its stages here and grants its credits. */
static int start_head(head *h, const sf_worker_options *o, const char *name, sf_error *error) {
  int rc = load_plugins(h->socket, o, h->welcome.stages, name, error);
  if (rc < 0) return rc;
  int64_t threads = o->threads > 0 ? o->threads : h->welcome.threads;
  rc = sf_group_worker_graph(&h->graph, h->welcome.stages, h->welcome.seed, h->welcome.error_policy, threads, error);
  if (rc == 0) {
    sf_pipeline_options po;
    sf_pipeline_options_init(&po);
    po.epochs = 0;
    po.rank = h->welcome.rank;
    po.world_size = h->welcome.world_size;
    sf_worker_stages_starting(&h->state);
    h->state.ring = h->ring != NULL;
    rc = sf_pipeline_new(&h->pipeline, h->graph, &po, error);
    sf_worker_stages_starting(NULL);
  }
  if (rc < 0) {
    /* the head learns why: the same stages would fail on every worker of this build */
    sf_wire_message m = {.type = SF_WIRE_ERROR, .errors = error, .n_errors = 1};
    sf_error ignored;
    sf_wire_send(h->socket, &m, 0, &ignored);
    return rc;
  }
  sf_context *ctx = sf_pipeline_context(h->pipeline);
  pthread_mutex_lock(&ctx->error_lock);
  ctx->on_record = on_record;
  ctx->on_record_opaque = &h->state;
  ctx->quiet = o->quiet;
  pthread_mutex_unlock(&ctx->error_lock);
  h->interval = h->welcome.heartbeat_interval > 0 ? h->welcome.heartbeat_interval : 1;
  h->timeout = h->welcome.heartbeat_timeout > 0 ? h->welcome.heartbeat_timeout : 5;
  h->last_heard = now_seconds();
  h->phase = HEAD_SERVING;
  sf_wire_message credit = {.type = SF_WIRE_CREDIT, .credits = (uint32_t)(o->credits > 0 ? o->credits : 4)};
  rc = sf_wire_send(h->socket, &credit, 0, error);
  if (rc < 0) return rc;
  if (!o->quiet) sf_log(SF_LOG_INFO | SF_LOG_UNPREFIXED, NULL, "shardflow worker %s: joined %s", name, h->endpoint);
  return 0;
}

/* Reads what the head sent; ends the head on its BYE, a refusal, or a failure to start its stages. */
static void read_head(head *h, const sf_worker_options *o, const char *name) {
  for (int budget = 0; budget < 64 && h->phase != HEAD_ENDED; budget++) {
    sf_wire_message m;
    sf_error e;
    int r = sf_wire_recv(h->socket, false, &m, ZMQ_DONTWAIT, &e);
    if (r == SF_EAGAIN) return;
    if (r < 0) {
      if (h->phase == HEAD_JOINING) {
        sf_error_set(&e, r, SF_AT(.url = h->endpoint), "bad answer from the head: %s", e.message);
        end_head(h, r, &e, name, o->quiet);
      } else if (!o->quiet) {
        sf_log(SF_LOG_WARNING | SF_LOG_UNPREFIXED, NULL, "shardflow worker %s: dropped a bad message from %s: %s",
               name, h->endpoint, e.message);
      }
      continue;
    }
    h->last_heard = now_seconds();
    if (h->phase == HEAD_JOINING && m.type == SF_WIRE_WELCOME) {
      h->welcome = m;
      r = start_head(h, o, name, &e);
      if (r < 0) end_head(h, r, &e, name, o->quiet);
      continue;
    }
    if (m.type == SF_WIRE_HEARTBEAT && h->ring && m.shm_freed) sf_shm_ring_set_freed(h->ring, m.shm_freed);
    if (m.type == SF_WIRE_BYE) {
      if (h->phase == HEAD_JOINING) {
        r = sf_error_set(&e, SF_EDENIED, SF_AT(.url = h->endpoint), "the head refused this worker: %s",
                         m.text ? m.text : "no reason given");
        end_head(h, r, &e, name, o->quiet);
      } else {
        end_head(h, 0, NULL, name, o->quiet);
      }
    } else if (m.type == SF_WIRE_UNIT && h->phase == HEAD_SERVING) {
      if (h->ring && m.shm_freed) sf_shm_ring_set_freed(h->ring, m.shm_freed);
      receive_unit(h, &m, name);
    }
    sf_wire_message_clear(&m);
  }
}

/* Sends a serving head its finished results and a heartbeat when due; ends it on failure or silence. */
static void serve_head(head *h, const sf_worker_options *o, const char *name, double now) {
  sf_error e;
  int failed = sf_pipeline_failed(h->pipeline);
  if (failed) {
    if (!sf_pipeline_last_error(h->pipeline, &e))
      sf_error_set(&e, failed, SF_AT(.url = h->endpoint), "the pipeline failed");
    sf_wire_message m = {.type = SF_WIRE_ERROR, .errors = &e, .n_errors = 1};
    sf_error ignored;
    sf_wire_send(h->socket, &m, 0, &ignored);
    end_head(h, failed, &e, name, o->quiet);
    return;
  }
  int done = 0;
  int64_t samples = 0;
  int rc = send_results(&h->state, h->socket, h->ring, h->pipeline, &done, &samples, &e);
  h->released -= done;
  h->units_served += (uint64_t)done;
  h->samples_served += (uint64_t)samples;
  if (rc < 0) {
    end_head(h, rc, &e, name, o->quiet);
    return;
  }
  if (now - h->last_beat >= h->interval) {
    h->last_beat = now;
    sf_wire_stage_stats stats[SF_WIRE_MAX_STATS];
    sf_wire_message hb = {.type = SF_WIRE_HEARTBEAT, .stats = stats, .n_stats = collect_stats(h->pipeline, stats)};
    sf_wire_send(h->socket, &hb, ZMQ_DONTWAIT, &e);
  }
  if (now - h->last_heard > h->timeout) {
    rc = sf_error_set(&e, SF_ENET, SF_AT(.url = h->endpoint),
                      "the head has been silent for %.1f s (heartbeat timeout): it ended or the network failed",
                      now - h->last_heard);
    end_head(h, rc, &e, name, o->quiet);
  }
}

/* This worker's name in its heads' logs: --name, else HOST-PID. */
static void worker_name(const sf_worker_options *o, char *name, size_t size) {
  if (o->name && o->name[0]) {
    snprintf(name, size, "%s", o->name);
  } else {
    char host[48] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(name, size, "%s-%d", host, (int)getpid());
  }
}

/* A head that started this process shares a ring with it (--shm-fd): results go there, not through the socket. */
static void attach_ring(const sf_worker_options *o, head *heads, int n, const char *name) {
  sf_error e;
  if (n != 1) {
    close((int)o->shm_fd);
    sf_log(SF_LOG_WARNING | SF_LOG_UNPREFIXED, NULL, "shardflow worker %s: --shm-fd serves one head; ignored", name);
  } else if (sf_shm_ring_attach((int)o->shm_fd, &heads[0].ring, &e) < 0) {
    sf_log(SF_LOG_WARNING | SF_LOG_UNPREFIXED, NULL, "shardflow worker %s: %s; results go through the socket",
           name, e.message);
  }
}

/* One turn of the loop for every head not ended: its messages, its results and heartbeats, its join deadline. */
static void tend_heads(head *heads, int n, const sf_worker_options *o, const char *name) {
  double now = now_seconds();
  for (int i = 0; i < n; i++) {
    head *h = &heads[i];
    if (h->phase == HEAD_ENDED) continue;
    read_head(h, o, name);
    if (h->phase == HEAD_SERVING) serve_head(h, o, name, now);
    if (h->phase == HEAD_JOINING && now > h->deadline) {
      sf_error e;
      int r = sf_error_set(&e, SF_ENET, SF_AT(.url = h->endpoint),
                           "no head answered within %.0f s: check that the head runs and listens at this "
                           "endpoint, and for tcp:// that this worker's public key is in the head's "
                           "allowed_keys and --server-key is the head's public key",
                           o->connect_timeout > 0 ? o->connect_timeout : 60);
      end_head(h, r, &e, name, o->quiet);
    }
  }
}

int sf_worker_run(const sf_worker_options *o, sf_error *error) {
  if (o->n_endpoints < 1) return sf_error_set(error, SF_EINVAL, SF_AT(), "no head to connect to: give --connect");
  if (o->n_server_keys > 1 && o->n_server_keys != o->n_endpoints)
    return sf_error_set(error, SF_EINVAL, SF_AT(),
                        "%d --server-key for %d --connect: give one for all heads, or one per --connect in order",
                        o->n_server_keys, o->n_endpoints);
  if (o->exit_with_parent) prctl(PR_SET_PDEATHSIG, SIGTERM);
  char name[64];
  worker_name(o, name, sizeof name);
  int n = o->n_endpoints, rr = 0, rc = 0;
  int slots = (int)(o->credits > 0 ? o->credits : 4);
  int done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  head *heads = calloc((size_t)n, sizeof *heads);
  zmq_pollitem_t *items = calloc((size_t)n + 1, sizeof *items);
  void *zctx = zmq_ctx_new();
  if (heads)
    for (int i = 0; i < n; i++) {
      heads[i] = (head){.endpoint = o->endpoints[i], .phase = HEAD_ENDED, .state.done_fd = done_fd};
      pthread_mutex_init(&heads[i].state.lock, NULL);
    }
  if (!zctx || done_fd < 0 || !heads || !items) {
    rc = sf_error_set(error, SF_ENOMEM, SF_AT(.url = o->endpoints[0]), "out of memory");
    goto out;
  }
  for (int i = 0; i < n && rc == 0; i++) rc = connect_head(&heads[i], zctx, o, i, name, error);
  if (rc < 0) goto out;
  if (o->shm_fd > 0) attach_ring(o, heads, n, name);
  for (;;) {
    bool stop = (o->stop && *o->stop) || (o->exit_with_parent && getppid() == 1);
    int live = 0;
    for (int i = 0; i < n; i++) {
      head *h = &heads[i];
      if (stop && h->phase == HEAD_SERVING && !(o->exit_with_parent && getppid() == 1)) {
        sf_wire_message bye = {.type = SF_WIRE_BYE, .text = (char *)"worker stopped by a signal"};
        sf_error ignored;
        sf_wire_send(h->socket, &bye, 0, &ignored);
      }
      if (stop) end_head(h, 0, NULL, name, true);
      if (h->phase != HEAD_ENDED) items[live++] = (zmq_pollitem_t){.socket = h->socket, .events = ZMQ_POLLIN};
    }
    if (!live) break;
    items[live] = (zmq_pollitem_t){.fd = done_fd, .events = ZMQ_POLLIN};
    if (zmq_poll(items, live + 1, 50) < 0 && zmq_errno() != EINTR) {
      rc = sf_error_set(error, SF_ENET, SF_AT(.url = o->endpoints[0]), "zmq_poll: %s", zmq_strerror(zmq_errno()));
      break;
    }
    if (items[live].revents & ZMQ_POLLIN) {
      uint64_t v;
      ssize_t r = read(done_fd, &v, sizeof v);
      (void)r;
    }
    tend_heads(heads, n, o, name);
    dispatch(heads, n, slots, &rr);
  }
  /* 0 when every head ended cleanly (BYE, or this worker was stopped); else the first head's failure */
  for (int i = 0; rc == 0 && i < n; i++)
    if (heads[i].rc < 0) {
      rc = heads[i].rc;
      *error = heads[i].error;
    }
out:
  for (int i = 0; heads && i < n; i++) {
    end_head(&heads[i], 0, NULL, name, true);
    pthread_mutex_destroy(&heads[i].state.lock);
    sf_shm_ring_unref(&heads[i].ring);
  }
  free(heads);
  free(items);
  if (zctx) zmq_ctx_term(zctx);
  if (done_fd >= 0) close(done_fd);
  return rc;
}
