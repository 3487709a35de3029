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
 * last samples leave the source.  One worker per process: the two stages
 * find the loop's state through `current`.
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
#include "remote.h"
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
} worker_state;

static worker_state *current;

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
  if (!current) {
    sf_node_error(node, SF_EINVAL, NULL, NULL, -1, "_worker_source runs only inside `shardflow worker`");
    return SF_EINVAL;
  }
  current->source = node;
  return 0;
}

static int source_step(sf_node *node) {
  worker_state *w = current;
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
    .init = source_init,
    .step = source_step,
};

/* ---- _worker_sink: collects each unit's output ---- */

static int sink_init(sf_node *node) {
  if (!current) {
    sf_node_error(node, SF_EINVAL, NULL, NULL, -1, "_worker_sink runs only inside `shardflow worker`");
    return SF_EINVAL;
  }
  return 0;
}

static int sink_step(sf_node *node) {
  worker_state *w = current;
  sf_item item;
  int rc = sf_node_pop(node, &item);
  if (rc < 0) return rc;
  if (item.kind == SF_ITEM_SAMPLE) {
    sf_sample *s = item.u.sample;
    /* written here, on the pool, so the network thread only sends */
    for (int f = 0; f < s->n_fields; f++) {
      if (sf_field_materialize(&s->fields[f]) < 0) {
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
  sf_node_stats st[SF_WIRE_MAX_STATS];
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
  return k;
}

/* Sends every finished unit's result. */
static int send_results(worker_state *w, void *socket, sf_pipeline *p, sf_error *error) {
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
    };
    int rc = sf_wire_send(socket, &m, 0, error);
    free_unit(u);
    if (rc < 0) return rc;
  }
}

static int receive_unit(worker_state *w, sf_wire_message *m) {
  wunit *u = calloc(1, sizeof *u);
  if (!u) return SF_ENOMEM;
  u->id = m->unit;
  u->n_in = m->n_samples;
  u->in = calloc((size_t)(m->n_samples ? m->n_samples : 1), sizeof *u->in);
  if (!u->in) {
    free(u);
    return SF_ENOMEM;
  }
  for (int i = 0; i < m->n_samples; i++) {
    u->in[i] = m->samples[i];
    m->samples[i] = NULL;
  }
  pthread_mutex_lock(&w->lock);
  append(&w->inbox, &w->inbox_tail, u);
  pthread_mutex_unlock(&w->lock);
  sf_node_notify(w->source);
  return 0;
}

/* Waits for the head's WELCOME; HELLO is queued by the DEALER until the connection is up. */
static int join_head(void *socket, const sf_worker_options *o, const char *name, sf_wire_message *welcome,
                     sf_error *error) {
  sf_wire_message hello = {.type = SF_WIRE_HELLO, .text = (char *)name, .pid = getpid(),
                           .threads = (uint32_t)(o->threads > 0 ? o->threads : sysconf(_SC_NPROCESSORS_ONLN))};
  int rc = sf_wire_send(socket, &hello, 0, error);
  if (rc < 0) return rc;
  double timeout = o->connect_timeout > 0 ? o->connect_timeout : 60;
  double deadline = now_seconds() + timeout;
  for (;;) {
    if (o->stop && *o->stop) return sf_error_set(error, SF_ECANCELED, SF_AT(.url = o->endpoint), "stopped");
    if (o->exit_with_parent && getppid() == 1)
      return sf_error_set(error, SF_ECANCELED, SF_AT(.url = o->endpoint), "the head's process ended");
    double left = deadline - now_seconds();
    if (left <= 0)
      return sf_error_set(error, SF_ENET, SF_AT(.url = o->endpoint),
                          "no head answered within %.0f s: check that the head runs and listens at this endpoint, "
                          "and for tcp:// that this worker's public key is in the head's allowed_keys and "
                          "--server-key is the head's public key",
                          timeout);
    zmq_pollitem_t item = {.socket = socket, .events = ZMQ_POLLIN};
    if (zmq_poll(&item, 1, 200) <= 0) continue;
    sf_error e;
    rc = sf_wire_recv(socket, false, welcome, ZMQ_DONTWAIT, &e);
    if (rc == SF_EAGAIN) continue;
    if (rc < 0) return sf_error_set(error, rc, SF_AT(.url = o->endpoint), "bad answer from the head: %s", e.message);
    if (welcome->type == SF_WIRE_WELCOME) return 0;
    if (welcome->type == SF_WIRE_BYE)
      return sf_error_set(error, SF_EDENIED, SF_AT(.url = o->endpoint), "the head refused this worker: %s",
                          welcome->text ? welcome->text : "no reason given");
    sf_wire_message_clear(welcome);
  }
}

/*
 * Loads the plugins the head's WELCOME names for the group's stages and checks they are the head's
 * builds; on a refusal tells the head with a BYE naming the plugin, and returns the error.
 */
static int load_plugins(void *socket, const sf_graph *stages, const char *name, sf_error *error) {
  for (int i = 0; stages && i < stages->n_plugins; i++) {
    const sf_graph_plugin *want = &stages->plugins[i];
    const sf_plugin *p;
    sf_error why = {0};
    int rc = sf_plugin_load(want->name, &p, &why);
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

int sf_worker_run(const sf_worker_options *o, sf_error *error) {
  if (o->exit_with_parent) prctl(PR_SET_PDEATHSIG, SIGTERM);
  char name[64];
  if (o->name && o->name[0]) {
    snprintf(name, sizeof name, "%s", o->name);
  } else {
    char host[48] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(name, sizeof name, "%s-%d", host, (int)getpid());
  }
  worker_state state = {.done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  pthread_mutex_init(&state.lock, NULL);
  void *zctx = zmq_ctx_new();
  sf_transport *transport = NULL;
  sf_pipeline *pipeline = NULL;
  sf_graph *graph = NULL;
  sf_wire_message welcome = {0};
  int rc = 0;
  if (!zctx || state.done_fd < 0) {
    rc = sf_error_set(error, SF_ENOMEM, SF_AT(.url = o->endpoint), "out of memory");
    goto out;
  }
  sf_transport_options t = {.endpoint = o->endpoint, .secret_key_file = o->secret_key_file,
                            .server_key_file = o->server_key_file, .plaintext = o->plaintext};
  rc = sf_transport_connect(zctx, &t, &transport, error);
  if (rc < 0) goto out;
  void *socket = sf_transport_socket(transport);
  rc = join_head(socket, o, name, &welcome, error);
  if (rc < 0) goto out;
  rc = load_plugins(socket, welcome.stages, name, error);
  if (rc < 0) goto out;

  int64_t threads = o->threads > 0 ? o->threads : welcome.threads;
  rc = sf_group_worker_graph(&graph, welcome.stages, welcome.seed, welcome.error_policy, threads, error);
  current = &state;
  if (rc == 0) {
    sf_pipeline_options po;
    sf_pipeline_options_init(&po);
    po.epochs = 0;
    po.rank = welcome.rank;
    po.world_size = welcome.world_size;
    rc = sf_pipeline_new(&pipeline, graph, &po, error);
  }
  if (rc < 0) {
    /* the head learns why: the same stages would fail on every worker of this build */
    sf_wire_message m = {.type = SF_WIRE_ERROR, .errors = error, .n_errors = 1};
    sf_error ignored;
    sf_wire_send(socket, &m, 0, &ignored);
    goto out;
  }
  sf_context *ctx = sf_pipeline_context(pipeline);
  pthread_mutex_lock(&ctx->error_lock);
  ctx->on_record = on_record;
  ctx->on_record_opaque = &state;
  ctx->quiet = o->quiet;
  pthread_mutex_unlock(&ctx->error_lock);

  double interval = welcome.heartbeat_interval > 0 ? welcome.heartbeat_interval : 1;
  double timeout = welcome.heartbeat_timeout > 0 ? welcome.heartbeat_timeout : 5;
  sf_wire_message credit = {.type = SF_WIRE_CREDIT, .credits = (uint32_t)(o->credits > 0 ? o->credits : 4)};
  rc = sf_wire_send(socket, &credit, 0, error);
  if (rc < 0) goto out;
  if (!o->quiet) sf_log(SF_LOG_INFO | SF_LOG_UNPREFIXED, NULL, "shardflow worker %s: joined %s", name, o->endpoint);
  double last_heard = now_seconds(), last_beat = 0;
  for (;;) {
    if (o->stop && *o->stop) {
      sf_wire_message bye = {.type = SF_WIRE_BYE, .text = (char *)"worker stopped by a signal"};
      sf_wire_send(socket, &bye, 0, error);
      rc = 0;
      break;
    }
    if (o->exit_with_parent && getppid() == 1) {
      rc = 0;
      break;
    }
    int failed = sf_pipeline_failed(pipeline);
    if (failed) {
      sf_error e;
      if (sf_pipeline_last_error(pipeline, &e)) {
        sf_wire_message m = {.type = SF_WIRE_ERROR, .errors = &e, .n_errors = 1};
        sf_wire_send(socket, &m, 0, error);
        *error = e;
      }
      rc = failed;
      break;
    }
    zmq_pollitem_t items[2] = {{.socket = socket, .events = ZMQ_POLLIN}, {.fd = state.done_fd, .events = ZMQ_POLLIN}};
    long wait_ms = (long)(interval * 1000 / 4);
    if (wait_ms < 5) wait_ms = 5;
    if (wait_ms > 250) wait_ms = 250;
    if (zmq_poll(items, 2, wait_ms) < 0 && zmq_errno() != EINTR) {
      rc = sf_error_set(error, SF_ENET, SF_AT(.url = o->endpoint), "zmq_poll: %s", zmq_strerror(zmq_errno()));
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t v;
      ssize_t n = read(state.done_fd, &v, sizeof v);
      (void)n;
    }
    bool bye = false;
    for (int budget = 0; budget < 64; budget++) {
      sf_wire_message m;
      sf_error e;
      int r = sf_wire_recv(socket, false, &m, ZMQ_DONTWAIT, &e);
      if (r == SF_EAGAIN) break;
      if (r < 0) {
        if (!o->quiet)
          sf_log(SF_LOG_WARNING | SF_LOG_UNPREFIXED, NULL,
                 "shardflow worker %s: dropped a bad message from the head: %s", name, e.message);
        continue;
      }
      last_heard = now_seconds();
      if (m.type == SF_WIRE_UNIT) {
        if (receive_unit(&state, &m) < 0)
          sf_log(SF_LOG_WARNING | SF_LOG_UNPREFIXED, NULL,
                 "shardflow worker %s: out of memory: unit %llu dropped (the head will resend it)", name,
                 (unsigned long long)m.unit);
      } else if (m.type == SF_WIRE_BYE) {
        bye = true;
      }
      sf_wire_message_clear(&m);
    }
    if (bye) {
      rc = 0;
      break;
    }
    rc = send_results(&state, socket, pipeline, error);
    if (rc < 0) break;
    double now = now_seconds();
    if (now - last_beat >= interval) {
      last_beat = now;
      sf_wire_stage_stats stats[SF_WIRE_MAX_STATS];
      sf_wire_message hb = {.type = SF_WIRE_HEARTBEAT, .stats = stats, .n_stats = collect_stats(pipeline, stats)};
      sf_wire_send(socket, &hb, ZMQ_DONTWAIT, error);
    }
    if (now - last_heard > timeout) {
      rc = sf_error_set(error, SF_ENET, SF_AT(.url = o->endpoint),
                        "the head has been silent for %.1f s (heartbeat timeout): it ended or the network failed",
                        now - last_heard);
      break;
    }
  }
out:
  pthread_mutex_lock(&state.lock);
  state.stopping = true;
  pthread_mutex_unlock(&state.lock);
  if (state.source) sf_node_notify(state.source);
  sf_pipeline_destroy(&pipeline);
  current = NULL;
  sf_wire_message_clear(&welcome);
  sf_graph_destroy(&graph);
  sf_transport_close(&transport);
  if (zctx) zmq_ctx_term(zctx);
  free_list(state.inbox);
  free_list(state.running);
  free_list(state.outbox);
  if (state.done_fd >= 0) close(state.done_fd);
  pthread_mutex_destroy(&state.lock);
  return rc;
}
