/*
 * The worker's side of a group: a network loop on the main thread, and a
 * pipeline _worker_source -> the group's stages -> _worker_sink on the pool.
 *
 * Units enter at the source in arrival order; after a unit's samples the
 * source pushes an epoch-end marker whose epoch is the unit id.  Map stages
 * pass markers through in order (replicas too), so when the sink sees the
 * marker every surviving sample of that unit has arrived: the unit is done
 * and its result goes back to the head.  A unit counts as running from its
 * first sample on: a unit larger than the queues reaches the sink before its
 * last samples leave the source.
 *
 * A worker may serve several heads (every rank of a job: `--connect` given
 * once per head).  Each head has its own connection, WELCOME, stages and
 * pipeline; the two stages find their head's state in their private struct,
 * set from `starting` while the network thread builds that pipeline.  Each
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

enum { MAX_PENDING_ERRORS = 64 };

typedef struct wunit {
  uint64_t id;
  sf_sample **in;
  int n_in, next_in;
  sf_sample **out;
  int n_out, cap_out;
  struct wunit *next;
} wunit;

typedef struct worker_state {
  pthread_mutex_t lock;
  wunit *inbox, *inbox_tail;       /* received, not yet fed to the pipeline */
  wunit *running, *running_tail;   /* fed (the last one maybe in part), waiting for their marker at the sink */
  wunit *feeding;                  /* the unit the source is pushing (the tail of running), or NULL */
  wunit *outbox, *outbox_tail;     /* done, to be sent */
  int done_fd;                     /* eventfd: the sink finished a unit */
  sf_node *source;
  bool stopping;
  sf_error errors[MAX_PENDING_ERRORS];
  int n_errors;
  uint64_t errors_dropped;
  uint64_t filtered_sent;          /* of the stages' filtered samples, reported in results so far */
  bool ring;                       /* results go into a shared-memory ring (set before the pipeline starts) */
} worker_state;

/* The head whose pipeline the network thread is building: its two stages keep it in their private struct. */
static worker_state *starting;

typedef struct stage_priv {
  worker_state *w;
} stage_priv;

static worker_state *state_of(sf_node *node) { return ((stage_priv *)sf_node_priv(node))->w; }

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void append(wunit **head, wunit **tail, wunit *u) {
  u->next = NULL;
  if (*tail) (*tail)->next = u;
  else *head = u;
  *tail = u;
}

static wunit *take_first(wunit **head, wunit **tail) {
  wunit *u = *head;
  if (!u) return NULL;
  *head = u->next;
  if (!*head) *tail = NULL;
  u->next = NULL;
  return u;
}

static void free_unit(wunit *u) {
  if (!u) return;
  for (int i = 0; i < u->n_in; i++) sf_sample_destroy(&u->in[i]);
  for (int i = 0; i < u->n_out; i++) sf_sample_destroy(&u->out[i]);
  free(u->in);
  free(u->out);
  free(u);
}

static void free_list(wunit *u) {
  while (u) {
    wunit *next = u->next;
    free_unit(u);
    u = next;
  }
}

/* ---- _worker_source: feeds received units into the group's stages ---- */

static int source_init(sf_node *node) {
  if (!starting) {
    sf_node_error(node, SF_EINVAL, NULL, NULL, -1, "_worker_source runs only inside `shardflow worker`");
    return SF_EINVAL;
  }
  ((stage_priv *)sf_node_priv(node))->w = starting;
  starting->source = node;
  return 0;
}

static int source_step(sf_node *node) {
  worker_state *w = state_of(node);
  pthread_mutex_lock(&w->lock);
  int rc = SF_EAGAIN;
  while (sf_node_output_ready(node)) {
    wunit *u = w->feeding;
    if (!u) {
      /* running before its first sample goes: the sink attributes samples to the oldest running unit */
      u = take_first(&w->inbox, &w->inbox_tail);
      if (!u) break;
      append(&w->running, &w->running_tail, u);
      w->feeding = u;
    }
    if (u->next_in < u->n_in) {
      sf_sample *s = u->in[u->next_in];
      u->in[u->next_in++] = NULL;
      sf_item item = {.kind = SF_ITEM_SAMPLE, .epoch = s->epoch, .u.sample = s};
      sf_node_push(node, &item);
    } else {
      sf_item marker = {.kind = SF_ITEM_EPOCH_END, .epoch = u->id};
      sf_node_push(node, &marker);
      w->feeding = NULL;
    }
    rc = 0;
  }
  if (rc == SF_EAGAIN && w->stopping) rc = SF_EOF;
  pthread_mutex_unlock(&w->lock);
  return rc;
}

const sf_stage_def sf_stage_worker_source = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "_worker_source",
    .summary = "a worker's input: the samples of the work units its head sends",
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(stage_priv),
    .init = source_init,
    .step = source_step,
};

/* ---- _worker_sink: collects each unit's output ---- */

static int sink_init(sf_node *node) {
  if (!starting) {
    sf_node_error(node, SF_EINVAL, NULL, NULL, -1, "_worker_sink runs only inside `shardflow worker`");
    return SF_EINVAL;
  }
  ((stage_priv *)sf_node_priv(node))->w = starting;
  return 0;
}

static int sink_step(sf_node *node) {
  worker_state *w = state_of(node);
  sf_item item;
  int rc = sf_node_pop(node, &item);
  if (rc < 0) return rc;
  if (item.kind == SF_ITEM_SAMPLE) {
    sf_sample *s = item.u.sample;
    /*
     * Written here, on the pool, so the network thread only sends; except, with a ring, the fields the
     * send will place there: their recipes then write straight into the ring (recipes may run on any
     * thread), with no tensor of their own to allocate and no copy (bench/groups.sh (b): 4.6% of all
     * cycles were that copy). A field that finds the ring full is written into a frame instead.
     */
    for (int f = 0; f < s->n_fields; f++) {
      sf_field *field = &s->fields[f];
      if (w->ring && field->recipe && sf_tensor_nbytes(&field->tensor) >= SF_SHM_MIN_BYTES) continue;
      if (sf_field_materialize(field) < 0) {
        sf_sample_destroy(&s);
        sf_node_error(node, SF_ENOMEM, NULL, NULL, -1, "out of memory writing a result");
        return SF_ENOMEM;
      }
    }
    pthread_mutex_lock(&w->lock);
    wunit *u = w->running;
    if (u && u->n_out == u->cap_out) {
      int cap = u->cap_out ? u->cap_out * 2 : 16;
      sf_sample **out = realloc(u->out, (size_t)cap * sizeof *out);
      if (out) {
        u->out = out;
        u->cap_out = cap;
      }
    }
    if (u && u->n_out < u->cap_out) {
      u->out[u->n_out++] = s;
      s = NULL;
    }
    pthread_mutex_unlock(&w->lock);
    if (s) {
      sf_sample_destroy(&s);
      return sf_node_error(node, SF_EINTERNAL, NULL, NULL, -1, "a sample arrived outside any work unit");
    }
    return 0;
  }
  if (item.kind == SF_ITEM_EPOCH_END) {
    pthread_mutex_lock(&w->lock);
    wunit *u = take_first(&w->running, &w->running_tail);
    if (u) append(&w->outbox, &w->outbox_tail, u);
    pthread_mutex_unlock(&w->lock);
    uint64_t one = 1;
    ssize_t n = write(w->done_fd, &one, sizeof one);
    (void)n;
    return 0;
  }
  sf_item_clear(&item);
  return 0;
}

const sf_stage_def sf_stage_worker_sink = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "_worker_sink",
    .summary = "a worker's output: each unit's samples, returned to the head",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .priv_size = sizeof(stage_priv),
    .init = sink_init,
    .step = sink_step,
};

/* ---- the network loop ---- */

static void on_record(void *opaque, const sf_error *e) {
  worker_state *w = opaque;
  /* called under the context's error lock, never under w->lock's holders' feet: take w->lock briefly */
  pthread_mutex_lock(&w->lock);
  if (w->n_errors < MAX_PENDING_ERRORS) w->errors[w->n_errors++] = *e;
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
static int send_results(worker_state *w, void *socket, sf_shm_ring *ring, sf_pipeline *p, int *units,
                        int64_t *samples, sf_error *error) {
  for (;;) {
    pthread_mutex_lock(&w->lock);
    wunit *u = take_first(&w->outbox, &w->outbox_tail);
    sf_error errors[MAX_PENDING_ERRORS];
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
    free_unit(u);
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
  worker_state state;              /* shared with the pipeline's threads under state.lock */
  wunit *queued, *queued_tail;     /* received, waiting for a decode slot (network thread only) */
  int released;                    /* units given a slot whose result is not sent yet */
  double deadline, last_heard, last_beat, interval, timeout;
  uint64_t units_served, samples_served;
  uint64_t contended;              /* units given a slot while another head had units waiting too */
  sf_shm_ring *ring;               /* the ring a head that started this process shares with it, or NULL */
  int rc;                          /* how it ended: 0 (BYE) or an error, in error */
  sf_error error;
} head;

static void receive_unit(head *h, sf_wire_message *m, const char *name) {
  wunit *u = calloc(1, sizeof *u);
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
  append(&h->queued, &h->queued_tail, u);
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
    wunit *u = take_first(&h->queued, &h->queued_tail);
    h->released++;
    busy++;
    pthread_mutex_lock(&h->state.lock);
    append(&h->state.inbox, &h->state.inbox_tail, u);
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
  free_list(h->queued);
  free_list(h->state.inbox);
  free_list(h->state.running);
  free_list(h->state.outbox);
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
    starting = &h->state;
    h->state.ring = h->ring != NULL;
    rc = sf_pipeline_new(&h->pipeline, h->graph, &po, error);
    starting = NULL;
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

int sf_worker_run(const sf_worker_options *o, sf_error *error) {
  if (o->n_endpoints < 1) return sf_error_set(error, SF_EINVAL, SF_AT(), "no head to connect to: give --connect");
  if (o->n_server_keys > 1 && o->n_server_keys != o->n_endpoints)
    return sf_error_set(error, SF_EINVAL, SF_AT(),
                        "%d --server-key for %d --connect: give one for all heads, or one per --connect in order",
                        o->n_server_keys, o->n_endpoints);
  if (o->exit_with_parent) prctl(PR_SET_PDEATHSIG, SIGTERM);
  char name[64];
  if (o->name && o->name[0]) {
    snprintf(name, sizeof name, "%s", o->name);
  } else {
    char host[48] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(name, sizeof name, "%s-%d", host, (int)getpid());
  }
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
  if (o->shm_fd > 0) {
    /* a head that started this process shares a ring with it: results go there, not through the socket */
    sf_error e;
    if (n != 1) {
      close((int)o->shm_fd);
      sf_log(SF_LOG_WARNING | SF_LOG_UNPREFIXED, NULL, "shardflow worker %s: --shm-fd serves one head; ignored", name);
    } else if (sf_shm_ring_attach((int)o->shm_fd, &heads[0].ring, &e) < 0) {
      sf_log(SF_LOG_WARNING | SF_LOG_UNPREFIXED, NULL, "shardflow worker %s: %s; results go through the socket",
             name, e.message);
    }
  }
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
