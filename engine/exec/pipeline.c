/* The executor: a pool of workers runs the nodes' step functions; bounded queues on every edge; batches out through next(). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "cpu_budget.h"
#include "graph.h"
#include "graph_groups.h"
#include "graph_plan.h"
#include "metrics.h"
#include "node.h"
#include "options.h"

struct sf_pipeline {
  sf_graph *graph;
  sf_context ctx;
  sf_node **nodes;       /* all replicas, chain order */
  int n_nodes;
  sf_queue *queues;      /* every edge queue plus the output queue */
  int n_queues;
  sf_queue *output;
  atomic_uint_fast64_t *branch_closed; /* per graph node: the epochs its branch closed (graphs with branches) */
  pthread_t *threads;
  int n_threads;
  int cpu_budget;        /* sf_cpu_budget_get().cpus when the pipeline was made */
  atomic_int failed;     /* the error code that stopped the pipeline, or 0 */
  /* scheduler */
  pthread_mutex_t sched_lock;
  pthread_cond_t sched_cond;
  atomic_uint_fast64_t sched_version;
  atomic_int sleepers;
  atomic_int live_nodes;
  uint64_t epoch;
  uint64_t step;         /* batches returned in this epoch */
  uint64_t epoch_samples; /* samples returned in this epoch */
  int event_fd;          /* readable while next() would not wait (see sf_pipeline_fd) */
  bool done;
  double started;        /* now_seconds() when the threads started */
  atomic_uint_fast64_t trainer_wait_ns; /* time next() waited for a batch (the bottleneck report) */
  sf_metrics_server *metrics; /* `metrics: HOST:PORT`, or NULL */
  char fingerprint[SF_ORDER_FINGERPRINT_SIZE]; /* sf_graph_order_fingerprint of the graph as given */
};

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sf_pipeline_options_init(sf_pipeline_options *o) {
  o->rank = -1;
  o->world_size = -1;
  o->epochs = -1;
  o->first_epoch = 0;
  o->first_step = 0;
}

/*
 * The first of two environment variables that is set (torchrun's, then Slurm's),
 * else fallback. A value that is not a whole number is an error, not a silent 0:
 * every rank reading the same shards would be worse than stopping.
 */
static int env_int(const char *a, const char *b, int fallback, int *out, sf_error *error) {
  const char *name = a, *v = getenv(a);
  if (!v || !*v) v = getenv(name = b);
  if (!v || !*v) {
    *out = fallback;
    return 0;
  }
  char *end;
  long x = strtol(v, &end, 10);
  if (end == v || *end || x < 0 || x > 1 << 20)
    return sf_error_set(error, SF_EOPTION, SF_NOWHERE,
                        "environment variable %s='%s' is not a rank or world size (a whole number)", name, v);
  *out = (int)x;
  return 0;
}

static void notify(sf_pipeline *p);

/* After a failure or a stop: next() returns at once, and a polling trainer must hear of it. */
static void wake_trainer(sf_pipeline *p) {
  uint64_t one = 1;
  ssize_t written = write(p->event_fd, &one, sizeof one);
  (void)written; /* the counter is far from overflow; a failed write leaves next()'s own wait */
  notify(p);
}

/* Stops the pipeline with code. n: the node whose step failed (recorded for it when it left no record), or NULL. */
static void fail(sf_pipeline *p, sf_node *n, int code, uint64_t errors_before) {
  if (atomic_load(&p->ctx.stop)) return; /* stopping: a step cut short is not a failure */
  if (n && atomic_load(&n->errors) == errors_before) { /* the stage returned an error without a record */
    sf_error e;
    sf_error_set(&e, code, SF_AT(.stage = n->name), "stage %s stopped: %s", n->def->name, sf_strerror(code));
    sf_context_record(&p->ctx, &e);
  }
  int expected = 0;
  atomic_compare_exchange_strong(&p->failed, &expected, code);
  atomic_store(&p->ctx.stop, true);
  for (int i = 0; i < p->n_queues; i++) sf_queue_wake_all(&p->queues[i]);
  wake_trainer(p);
}

/*
 * Scheduling: a pool of workers runs the step functions of every node
 * (a step takes what input there is, produces only when downstream has
 * room, and otherwise returns "not ready": it never blocks, so a few
 * threads run any number of nodes). A worker scans the nodes from the
 * sink back to the source (draining first keeps memory low), takes a node nobody runs,
 * steps it while it makes progress and its output has room, and moves on.
 * A worker that finds nothing to do sleeps until some node made progress.
 */
enum { STEPS_PER_TURN = 256 };

static void notify(sf_pipeline *p) {
  atomic_fetch_add(&p->sched_version, 1);
  if (atomic_load(&p->sleepers) > 0) {
    pthread_mutex_lock(&p->sched_lock);
    pthread_cond_broadcast(&p->sched_cond);
    pthread_mutex_unlock(&p->sched_lock);
  }
}

sf_context *sf_pipeline_context(sf_pipeline *p) { return &p->ctx; }

int sf_pipeline_failed(const sf_pipeline *p) { return atomic_load(&((sf_pipeline *)p)->failed); }

void sf_node_notify(sf_node *n) {
  if (n->pipeline) notify(n->pipeline);
}

static void close_outputs(sf_pipeline *p, sf_node *n) {
  for (int i = 0; i < n->out.n; i++) sf_queue_close(n->out.queues[i]);
  atomic_store(&n->done, true);
  atomic_fetch_sub(&p->live_nodes, 1);
  notify(p);
}

/* Steps a node until it stalls. Returns the number of steps that made progress. */
static int run_turn(sf_pipeline *p, sf_node *n) {
  int steps = 0;
  double t = now_seconds();
  uint64_t others = sf_thread_deferred_ns(); /* other nodes' deferred fields written here are theirs */
  while (steps < STEPS_PER_TURN && !atomic_load(&p->ctx.stop)) {
    if (!sf_port_can_push(&n->out)) break;
    uint64_t errors_before = atomic_load(&n->errors);
    int r = sf_node_step(n);
    if (atomic_load(&p->ctx.over_budget)) { /* the budget's record says why */
      fail(p, NULL, SF_EBUDGET, 0);
      break;
    }
    if (r == 0) {
      if (n->starved_since > 0) {
        double now = now_seconds();
        atomic_fetch_add_explicit(&n->wait_ns, (uint64_t)((now - n->starved_since) * 1e9), memory_order_relaxed);
        n->starved_since = 0;
      }
      steps++;
      continue;
    }
    if (r == SF_EAGAIN) {
      if (n->starved_since == 0) n->starved_since = now_seconds();
      break;
    }
    if (r != SF_EOF) fail(p, n, r, errors_before);
    close_outputs(p, n);
    steps++;
    break;
  }
  uint64_t wall = (uint64_t)((now_seconds() - t) * 1e9), moved = sf_thread_deferred_ns() - others;
  atomic_fetch_add_explicit(&n->busy_ns, wall > moved ? wall - moved : 0, memory_order_relaxed);
  return steps;
}

static void *pool_worker(void *arg) {
  sf_pipeline *p = arg;
  while (!atomic_load(&p->ctx.stop) && atomic_load(&p->live_nodes) > 0) {
    uint64_t version = atomic_load(&p->sched_version);
    int progress = 0;
    for (int i = p->n_nodes - 1; i >= 0; i--) {
      sf_node *n = p->nodes[i];
      if (atomic_load(&n->done)) continue;
      if (atomic_exchange(&n->running, true)) continue;
      int steps = atomic_load(&n->done) ? 0 : run_turn(p, n);
      atomic_store(&n->running, false);
      if (steps) {
        progress += steps;
        notify(p);
      }
    }
    if (progress) continue;
    pthread_mutex_lock(&p->sched_lock);
    atomic_fetch_add(&p->sleepers, 1);
    if (atomic_load(&p->sched_version) == version && !atomic_load(&p->ctx.stop)) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      ts.tv_nsec += 100 * 1000 * 1000; /* a safety net only: progress always notifies */
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&p->sched_cond, &p->sched_lock, &ts);
    }
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->sched_lock);
  }
  return NULL;
}

static void destroy_nodes(sf_pipeline *p) {
  for (int i = 0; i < p->n_nodes; i++) {
    sf_node *n = p->nodes[i];
    if (!n) continue;
    if (n->def && n->priv) {
      if (n->def->uninit) n->def->uninit(n);
      sf_options_free(n->def->options, n->priv);
    }
    sf_node_release_deferred(n);
    free(n->priv);
    free(n->in.queues);
    for (int j = 0; n->more_in && j + 1 < n->n_inputs; j++) free(n->more_in[j].queues);
    free(n->more_in);
    free(n->out.queues);
    free(n);
  }
  free(p->nodes);
  p->nodes = NULL;
}

static void join_threads(sf_pipeline *p) {
  for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
  p->n_threads = 0;
}

/* Only atomics, the queues' own locks and the eventfd: safe beside a next() in another thread. */
void sf_pipeline_stop(sf_pipeline *p) {
  if (!p) return;
  atomic_store(&p->ctx.stop, true);
  for (int i = 0; i < p->n_queues; i++) sf_queue_wake_all(&p->queues[i]);
  wake_trainer(p);
}

void sf_pipeline_destroy(sf_pipeline **pp) {
  if (!pp || !*pp) return;
  sf_pipeline *p = *pp;
  sf_metrics_server_destroy(&p->metrics); /* first: it reads the nodes */
  atomic_store(&p->ctx.stop, true);
  for (int i = 0; i < p->n_queues; i++) sf_queue_wake_all(&p->queues[i]);
  notify(p);
  join_threads(p);
  free(p->threads);
  destroy_nodes(p);
  for (int i = 0; i < p->n_queues; i++) sf_queue_destroy(&p->queues[i]);
  free(p->queues);
  free(p->branch_closed);
  sf_graph_destroy(&p->graph);
  sf_context_destroy(&p->ctx);
  pthread_mutex_destroy(&p->sched_lock);
  pthread_cond_destroy(&p->sched_cond);
  if (p->event_fd >= 0) close(p->event_fd);
  free(p);
  *pp = NULL;
}

/* Items each queue of a replicated edge holds at least, however many replicas share the edge's queue_size. */
enum { EDGE_QUEUE_MIN = 4 };

static size_t capacity_for(sf_port_kind kind, int64_t queue_size) {
  switch (kind) {
  case SF_PORT_SHARD: return 4;
  case SF_PORT_BATCH: return 4;
  default: return (size_t)queue_size;
  }
}

/* What build knows of each graph node while it wires them, indexed by graph node. */
typedef struct wiring {
  int *consumer;         /* the node this one feeds; -1 for the last, which feeds the output queue */
  int *out_count;        /* how many queues leave the node */
  sf_queue **out_queues; /* the first of them */
  /* A branch is a source and the chain after it up to a mix; scope[i] is its source, -1 after the mix. */
  int *scope;
} wiring;

static void wiring_free(wiring *w) {
  free(w->scope);
  free(w->consumer);
  free(w->out_count);
  free(w->out_queues);
}

/* Allocates the pipeline's nodes and queues (every node feeds one consumer through max(replicas) queues, the last
 * the output queue) and the wiring's tables. */
static int wiring_new(sf_pipeline *p, const int *inputs, wiring *w, sf_error *error) {
  sf_graph *g = p->graph;
  int total = 0;
  for (int i = 0; i < g->n_nodes; i++) total += (int)g->nodes[i].replicas;
  p->nodes = calloc((size_t)total, sizeof *p->nodes);
  w->consumer = malloc((size_t)g->n_nodes * sizeof *w->consumer);
  w->out_count = calloc((size_t)g->n_nodes, sizeof *w->out_count);
  w->out_queues = calloc((size_t)g->n_nodes, sizeof *w->out_queues);
  w->scope = malloc((size_t)g->n_nodes * sizeof *w->scope);
  bool branches = sf_graph_has_branches(g);
  if (branches && (p->branch_closed = calloc((size_t)g->n_nodes, sizeof *p->branch_closed)))
    for (int i = 0; i < g->n_nodes; i++) atomic_init(&p->branch_closed[i], p->ctx.first_epoch);
  if (w->consumer)
    for (int i = 0; i < g->n_nodes; i++) w->consumer[i] = -1;
  for (int i = 0; w->consumer && i < g->n_nodes * SF_GRAPH_MAX_INPUTS; i++)
    if (inputs[i] >= 0) w->consumer[inputs[i]] = i / SF_GRAPH_MAX_INPUTS;
  int n_queues = 1;
  for (int i = 0; w->consumer && i < g->n_nodes; i++) {
    if (w->consumer[i] < 0) continue;
    int a = (int)g->nodes[i].replicas, b = (int)g->nodes[w->consumer[i]].replicas;
    n_queues += a > b ? a : b;
  }
  p->queues = calloc((size_t)n_queues, sizeof *p->queues);
  if (!p->nodes || !p->queues || !w->consumer || !w->out_count || !w->out_queues || !w->scope ||
      (branches && !p->branch_closed))
    return sf_graph_error(error, SF_ENOMEM, g, -1, "out of memory");
  return 0;
}

/* Initialises the queues of the edge out of graph node gi, from p->queues[q] on. Returns how many (max(replicas)
 * of the edge's two ends, 1 to the trainer) or a negative error. */
static int build_edge_queues(sf_pipeline *p, const wiring *w, int gi, const sf_stage_def *def, int q,
                             sf_error *error) {
  sf_graph *g = p->graph;
  int replicas = (int)g->nodes[gi].replicas;
  int out_n = 1;
  size_t cap = capacity_for(sf_port_first_kind(def->outputs), g->queue_size);
  if (w->consumer[gi] >= 0) {
    int next = (int)g->nodes[w->consumer[gi]].replicas;
    out_n = replicas > next ? replicas : next;
  }
  bool replicated = out_n > 1;
  /* An edge's budget is split over its queues, so that replicas (the plan gives one per CPU) add
     parallelism, not memory: at least EDGE_QUEUE_MIN items each, and always one item whatever its bytes. */
  size_t bytes = (size_t)sf_graph_edge_bytes(g, &g->nodes[gi]);
  if (replicated) {
    cap = cap / (size_t)out_n > EDGE_QUEUE_MIN ? cap / (size_t)out_n : EDGE_QUEUE_MIN;
    bytes = bytes ? (bytes / (size_t)out_n ? bytes / (size_t)out_n : 1) : 0;
  }
  for (int i = 0; i < out_n; i++) {
    size_t wake = w->consumer[gi] < 0 || replicated ? 1 : (cap / 4 < 16 ? (cap / 4 ? cap / 4 : 1) : 16);
    int r = sf_queue_init(&p->queues[q + i], cap, wake, 1);
    if (r < 0) return sf_graph_error(error, r, g, -1, "out of memory");
    sf_queue_set_max_bytes(&p->queues[q + i], bytes);
    p->n_queues++;
  }
  return out_n;
}

/* Points replica rep's ports at its queues: one queue per replica, or all of a producer's queues in round-robin
 * order for a single consumer. out is the first of the node's out_n output queues. */
static int connect_replica(sf_pipeline *p, const wiring *w, sf_node *n, const int *in, sf_queue *out, int out_n,
                           sf_error *error) {
  sf_graph *g = p->graph;
  int rep = n->replica, replicas = n->replicas;
  while (n->n_inputs < SF_GRAPH_MAX_INPUTS && in[n->n_inputs] >= 0) n->n_inputs++;
  if (n->n_inputs > 1 && !(n->more_in = calloc((size_t)n->n_inputs - 1, sizeof *n->more_in)))
    return sf_graph_error(error, SF_ENOMEM, g, -1, "out of memory");
  for (int port = 0; port < n->n_inputs; port++) {
    sf_port *pt = port == 0 ? &n->in : &n->more_in[port - 1];
    n->input_names[port] = g->nodes[in[port]].name;
    pt->n = replicas > 1 ? 1 : w->out_count[in[port]];
    pt->queues = calloc((size_t)pt->n, sizeof *pt->queues);
    if (!pt->queues) return sf_graph_error(error, SF_ENOMEM, g, -1, "out of memory");
    for (int i = 0; i < pt->n; i++) pt->queues[i] = &w->out_queues[in[port]][replicas > 1 ? rep : i];
  }
  n->out.n = replicas > 1 ? 1 : out_n;
  n->out.queues = calloc((size_t)n->out.n, sizeof *n->out.queues);
  if (!n->out.queues) return sf_graph_error(error, SF_ENOMEM, g, -1, "out of memory");
  for (int i = 0; i < n->out.n; i++) n->out.queues[i] = &out[replicas > 1 ? rep : i];
  return 0;
}

/* Makes replica rep of graph node gi into *slot (owned by p from then on, also on failure), wires it and runs the
 * stage's init. */
static int build_replica(sf_pipeline *p, const wiring *w, int gi, const sf_stage_def *def, const int *in,
                         sf_queue *out, int out_n, int rep, sf_node **slot, sf_error *error) {
  sf_graph *g = p->graph;
  const sf_graph_node *gn = &g->nodes[gi];
  sf_node *n = calloc(1, sizeof *n);
  if (!n || sf_node_new_deferred(n) < 0) {
    free(n);
    return sf_graph_error(error, SF_ENOMEM, g, -1, "out of memory");
  }
  *slot = n;
  p->n_nodes++;
  n->def = def;
  n->group_stages = gn->group_stages;
  n->ctx = &p->ctx;
  n->pipeline = p;
  n->replica = rep;
  n->replicas = (int)gn->replicas;
  n->stage_replicas = slot - rep; /* build() gives each stage's replicas consecutive slots */
  n->replicas_planned = gn->replicas_planned;
  n->may_defer = gn->may_defer;
  n->graph_node = gn;
  snprintf(n->name, sizeof n->name, "%s", gn->name);
  if (p->branch_closed && w->scope[gi] >= 0) n->branch_closed = &p->branch_closed[w->scope[gi]];
  int r = connect_replica(p, w, n, in, out, out_n, error);
  if (r < 0) return r;
  r = sf_graph_node_apply(g, gn, def, &n->priv, error);
  if (r < 0) return r;
  r = def->init ? def->init(n) : 0;
  if (r < 0) /* The stage's own record says what is wrong; the graph file and line say where. */
    sf_graph_error(error, r, g, gn->line, "node '%s' (%s) cannot start: %s", gn->name, def->name,
                   p->ctx.has_error ? p->ctx.last_error.message : sf_strerror(r));
  return r;
}

/* Builds the replicas of every node and the queues between them (inputs: sf_graph_resolve_links). */
static int build(sf_pipeline *p, const int *order, const sf_stage_def **defs, const int *inputs, sf_error *error) {
  sf_graph *g = p->graph;
  wiring w = {0};
  int r = wiring_new(p, inputs, &w, error);
  int first_node = 0, q = 0;
  for (int k = 0; k < g->n_nodes && r == 0; k++) {
    int gi = order[k];
    int replicas = (int)g->nodes[gi].replicas;
    const int *in = &inputs[gi * SF_GRAPH_MAX_INPUTS];
    w.scope[gi] = in[0] < 0 ? gi : in[1] >= 0 ? -1 : w.scope[in[0]];
    int out_n = build_edge_queues(p, &w, gi, defs[gi], q, error);
    if (out_n < 0) {
      r = out_n;
      break;
    }
    sf_queue *out = w.out_queues[gi] = &p->queues[q];
    w.out_count[gi] = out_n;
    if (w.consumer[gi] < 0) p->output = out;
    q += out_n;
    for (int rep = 0; rep < replicas && r == 0; rep++)
      r = build_replica(p, &w, gi, defs[gi], in, out, out_n, rep, &p->nodes[first_node + rep], error);
    first_node += replicas;
  }
  wiring_free(&w);
  return r;
}

/* A scrape of /metrics (on the server's thread): the server gets the nodes and totals from here, and never calls
 * this file itself. */
static int metrics_text(void *opaque, sf_strbuf *out) {
  sf_pipeline *p = opaque;
  return sf_metrics_format(p->nodes, p->n_nodes, sf_pipeline_error_count(p), sf_pipeline_trainer_wait(p), out);
}

/* A pipeline with its context, event fd and scheduler's lock and clock set up, and nothing else; NULL when out
 * of memory. */
static sf_pipeline *pipeline_alloc(void) {
  sf_pipeline *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->cpu_budget = sf_cpu_budget_get().cpus;
  sf_context_init(&p->ctx);
  atomic_init(&p->failed, 0);
  p->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  pthread_mutex_init(&p->sched_lock, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&p->sched_cond, &attr);
  pthread_condattr_destroy(&attr);
  return p;
}

/* The pipeline's own graph: a copy, or with groups the head's part of the chain, with one group's head node per group
 * and the plan of what each group sends (its stages as its workers get them, and a node added on the head). */
static int take_graph(sf_pipeline *p, const sf_graph *graph, sf_error *error) {
  if (graph->n_groups == 0) {
    p->graph = sf_graph_copy(graph);
    return p->graph ? 0 : SF_ENOMEM;
  }
  int r = sf_graph_split_groups(graph, &p->graph, error);
  if (r == 0) r = sf_graph_plan_groups(p->graph, error);
  if (r < 0) sf_graph_destroy(&p->graph);
  return r;
}

/* Seed, epochs, error budget, and rank and world size (options first, then RANK/WORLD_SIZE or SLURM's). */
static int set_run_context(sf_pipeline *p, const sf_pipeline_options *options, sf_error *error) {
  sf_context *c = &p->ctx;
  c->seed = p->graph->seed;
  c->epochs = options->epochs >= 0 ? (uint64_t)options->epochs : (uint64_t)p->graph->epochs;
  c->first_epoch = options->first_epoch;
  c->first_step = options->first_step;
  p->step = options->first_step;
  c->error_policy = p->graph->error_policy;
  c->max_errors = (uint64_t)p->graph->max_errors;
  c->max_error_rate = p->graph->max_error_rate;
  int r = 0;
  if (options->rank >= 0)
    c->rank = options->rank;
  else
    r = env_int("RANK", "SLURM_PROCID", 0, &c->rank, error);
  if (r == 0 && options->world_size > 0)
    c->world_size = options->world_size;
  else if (r == 0)
    r = env_int("WORLD_SIZE", "SLURM_NTASKS", 1, &c->world_size, error);
  if (r < 0) return r;
  if (c->world_size < 1) c->world_size = 1;
  atomic_init(&c->epochs_closed, c->first_epoch);
  p->epoch = c->first_epoch;
  if (c->rank >= c->world_size)
    return sf_graph_error(error, SF_EOPTION, p->graph, -1,
                          "rank %d is not below world size %d: check RANK/WORLD_SIZE or the rank options", c->rank,
                          c->world_size);
  if (c->epochs > 0 && c->first_epoch >= c->epochs)
    return sf_graph_error(error, SF_EOPTION, p->graph, -1,
                          "cannot start at epoch %llu: the run has %llu epochs (0..%llu); resume from an earlier "
                          "state or raise epochs",
                          (unsigned long long)c->first_epoch, (unsigned long long)c->epochs,
                          (unsigned long long)c->epochs - 1);
  return 0;
}

/* Resolves the graph's links, plans replicas and builds the nodes and queues; the output queue wakes event_fd. */
static int build_graph(sf_pipeline *p, const sf_graph *graph, sf_error *error) {
  int *order, *inputs;
  const sf_stage_def **defs;
  int r = sf_graph_resolve_links(p->graph, &order, &defs, &inputs, error);
  if (r < 0) return r;
  sf_graph_plan(p->graph, defs, inputs, p->cpu_budget);
  p->ctx.quiet = true; /* init errors are returned to the caller, not printed */
  r = build(p, order, defs, inputs, error);
  p->ctx.quiet = false;
  if (r == 0) r = sf_graph_order_fingerprint(graph, p->fingerprint, sizeof p->fingerprint, error);
  if (r == 0 && p->event_fd < 0) r = sf_graph_error(error, SF_ENOMEM, p->graph, -1, "eventfd: %m");
  if (r == 0) sf_queue_set_notify_fd(p->output, p->event_fd);
  free(order);
  free(defs);
  free(inputs);
  return r;
}

/* Starts the pool's worker threads: the graph's threads setting, else one per CPU of the budget. */
static int start_pool(sf_pipeline *p, sf_error *error) {
  int workers = (int)p->graph->threads;
  if (workers <= 0) workers = p->cpu_budget;
  atomic_store(&p->live_nodes, p->n_nodes);
  p->threads = calloc((size_t)workers, sizeof *p->threads);
  if (!p->threads) return SF_ENOMEM;
  for (int i = 0; i < workers; i++) {
    if (pthread_create(&p->threads[p->n_threads], NULL, pool_worker, p) != 0)
      return sf_graph_error(error, SF_ENOMEM, p->graph, -1, "cannot start a thread");
    p->n_threads++;
  }
  return 0;
}

int sf_pipeline_new(sf_pipeline **pp, const sf_graph *graph, const sf_pipeline_options *options, sf_error *error) {
  *pp = NULL;
  sf_pipeline_options defaults;
  if (!options) {
    sf_pipeline_options_init(&defaults);
    options = &defaults;
  }
  sf_pipeline *p = pipeline_alloc();
  if (!p) return SF_ENOMEM;
  int r = take_graph(p, graph, error);
  if (r < 0) { /* nothing else was made yet */
    if (p->event_fd >= 0) close(p->event_fd);
    sf_context_destroy(&p->ctx);
    free(p);
    return r;
  }
  r = set_run_context(p, options, error);
  if (r == 0) r = build_graph(p, graph, error);
  if (r == 0) r = start_pool(p, error);
  if (r == 0) p->started = now_seconds();
  if (r == 0 && p->graph->metrics[0])
    r = sf_metrics_server_new(&p->metrics, metrics_text, p, p->graph->metrics, error);
  if (r < 0) {
    sf_pipeline_destroy(&p);
    return r;
  }
  *pp = p;
  return 0;
}

/*
 * An epoch reached the trainer: one that delivered nothing (every shard missing, wrong
 * credentials...) is an error, else `epochs: 0` would spin through empty epochs for ever;
 * then the error budget is judged over the whole epoch. The empty epoch is a consequence of
 * the records before it (or of shards without samples): it stops the run as its verdict,
 * said once by whoever reports the stop, and is neither counted nor printed as another record.
 * Returns 0 or the failure code.
 */
static int end_epoch(sf_pipeline *p, uint64_t epoch) {
  bool resumed = epoch == p->ctx.first_epoch && p->ctx.first_step > 0; /* its batches were returned before */
  uint64_t delivered = p->epoch_samples;
  p->epoch_samples = 0;
  int code = sf_context_check_budget(&p->ctx, true);
  if (code == 0 && delivered == 0 && !resumed) {
    char cause[1024];
    bool code_wrong;
    sf_context_cause(&p->ctx, cause, sizeof cause, &code_wrong);
    uint64_t errors = sf_pipeline_error_count(p), skipped = sf_pipeline_skipped(p);
    sf_error first = {0}, e;
    pthread_mutex_lock(&p->ctx.error_lock);
    if (p->ctx.error_count) first = p->ctx.first_error;
    pthread_mutex_unlock(&p->ctx.error_lock);
    code = errors ? first.code : SF_ENOENT;
    if (code_wrong)
      sf_error_set(&e, code, SF_NOWHERE, "epoch %llu delivered no sample: %s", (unsigned long long)epoch, cause);
    else
      sf_error_set(&e, code, SF_NOWHERE,
                   "epoch %llu delivered no sample (%llu error records, %llu samples skipped%s%s); check the shard "
                   "list, the credentials and that members are named KEY.EXT",
                   (unsigned long long)epoch, (unsigned long long)errors, (unsigned long long)skipped,
                   cause[0] ? "; " : "", cause);
    sf_context_set_verdict(&p->ctx, &e);
  }
  if (code) fail(p, NULL, code, 0);
  return code;
}

int sf_pipeline_next(sf_pipeline *p, sf_batch **batch, double timeout) {
  *batch = NULL;
  double deadline = timeout >= 0 ? now_seconds() + timeout : 0;
  for (;;) {
    int failed = atomic_load(&p->failed);
    if (failed) return failed;
    if (p->done) return SF_EOF;
    if (atomic_load(&p->ctx.stop)) { /* sf_pipeline_stop(), or a failure that set failed just before stop */
      failed = atomic_load(&p->failed);
      return failed ? failed : SF_ECANCELED;
    }
    sf_item item;
    int r = sf_queue_pop(p->output, &item);
    if (r == 0) {
      notify(p); /* the sink may have been waiting for room */
      if (item.kind == SF_ITEM_BATCH) {
        *batch = item.u.batch;
        p->step++;
        p->epoch_samples += (uint64_t)(*batch)->size;
        return 0;
      }
      if (item.kind == SF_ITEM_EPOCH_END) {
        if ((r = end_epoch(p, item.epoch)) < 0) return r;
        p->epoch = item.epoch + 1;
        p->step = 0;
        return SF_EOF;
      }
      sf_item_clear(&item);
      continue;
    }
    if (r == SF_EOF) {
      failed = atomic_load(&p->failed);
      if (failed) return failed;
      p->done = true;
      join_threads(p); /* every node has closed its output: collect their final metrics */
      return SF_EOF;
    }
    double left = timeout >= 0 ? deadline - now_seconds() : -1;
    if (timeout >= 0 && left <= 0) return SF_ETIMEDOUT;
    double t0 = now_seconds();
    sf_queue_wait_readable(p->output, &p->ctx.stop, left);
    atomic_fetch_add(&p->trainer_wait_ns, (uint_fast64_t)((now_seconds() - t0) * 1e9));
  }
}

uint64_t sf_pipeline_epoch(const sf_pipeline *p) { return p->epoch; }
uint64_t sf_pipeline_step(const sf_pipeline *p) { return p->step; }
int sf_pipeline_fd(const sf_pipeline *p) { return p->event_fd; }
int sf_pipeline_rank(const sf_pipeline *p) { return p->ctx.rank; }
int sf_pipeline_world_size(const sf_pipeline *p) { return p->ctx.world_size; }
const char *sf_pipeline_order_fingerprint(const sf_pipeline *p) { return p->fingerprint; }

sf_node *const *sf_pipeline_nodes(sf_pipeline *p, int *n) {
  *n = p->n_nodes;
  return p->nodes;
}
double sf_pipeline_elapsed(const sf_pipeline *p) { return now_seconds() - p->started; }
int sf_pipeline_cpu_budget(const sf_pipeline *p) { return p->cpu_budget; }
double sf_pipeline_trainer_wait(const sf_pipeline *p) {
  return (double)atomic_load(&((sf_pipeline *)p)->trainer_wait_ns) * 1e-9;
}
/* A stage's view of the clocks above (stage.h); a node under the test harness has no pipeline. */
double sf_node_elapsed(const sf_node *n) { return n->pipeline ? sf_pipeline_elapsed(n->pipeline) : 0; }
double sf_node_trainer_wait(const sf_node *n) { return n->pipeline ? sf_pipeline_trainer_wait(n->pipeline) : -1; }
int sf_pipeline_metrics_port(const sf_pipeline *p) { return p->metrics ? sf_metrics_server_port(p->metrics) : 0; }

size_t sf_node_stats_size(void) { return sizeof(sf_node_stats); }

int sf_pipeline_stats(const sf_pipeline *p, sf_node_stats *stats, int max) {
  int count = 0;
  for (int i = 0; i < p->n_nodes; i++) {
    const sf_node *n = p->nodes[i];
    if (n->replica == 0) count++;
    if (count > max || count == 0) continue;
    sf_node_stats *s = &stats[count - 1];
    if (n->replica == 0) {
      memset(s, 0, sizeof *s);
      snprintf(s->name, sizeof s->name, "%s", n->name);
      snprintf(s->type, sizeof s->type, "%s", n->def->name);
      s->replicas = n->replicas;
    }
    s->items += atomic_load(&n->items);
    s->bytes += atomic_load(&n->bytes);
    s->errors += atomic_load(&n->errors);
    s->skipped += atomic_load(&n->skipped);
    s->filtered += atomic_load(&n->filtered);
    s->busy_seconds += (double)(atomic_load_explicit(&n->busy_ns, memory_order_relaxed) + sf_node_deferred_ns(n)) * 1e-9;
    s->wait_seconds += (double)atomic_load_explicit(&n->wait_ns, memory_order_relaxed) * 1e-9;
    s->n_inputs = n->n_inputs;
    for (int j = 0; j < n->n_inputs && j < SF_NODE_INPUTS_MAX; j++) {
      snprintf(s->input_names[j], sizeof s->input_names[j], "%s", n->input_names[j]);
      s->input_items[j] += atomic_load_explicit(&n->input_items[j], memory_order_relaxed);
    }
    /* Replicas may have added their counters in another order: summed by name. */
    int counters = atomic_load_explicit(&n->n_counters, memory_order_acquire);
    for (int c = 0; c < counters; c++) {
      int k = 0;
      while (k < s->n_counters && strcmp(s->counter_names[k], n->counter_names[c]) != 0) k++;
      if (k == SF_NODE_COUNTERS) continue; /* cannot be: every replica has at most these names */
      if (k == s->n_counters) snprintf(s->counter_names[s->n_counters++], SF_COUNTER_NAME_MAX, "%s", n->counter_names[c]);
      s->counters[k] += atomic_load_explicit(&n->counters[c], memory_order_relaxed);
    }
    sf_node_stage_stats_add(p->nodes[i], &s->stage, n->replica == 0);
  }
  return count;
}

int sf_pipeline_workers(sf_pipeline *p, const char *name, sf_worker_stats *workers, int max) {
  for (int i = 0; i < p->n_nodes; i++) {
    sf_node *n = p->nodes[i];
    if (n->replica != 0 || strcmp(n->name, name) != 0) continue;
    if (!n->def->stats) return 0;
    sf_stage_stats ignored = {0};
    int count = n->def->stats(n, &ignored, max > 0 ? workers : NULL, max > 0 ? max : 0);
    return count > 0 ? count : 0;
  }
  return 0;
}

uint64_t sf_pipeline_error_count(const sf_pipeline *p) {
  pthread_mutex_lock((pthread_mutex_t *)&p->ctx.error_lock);
  uint64_t n = p->ctx.error_count;
  pthread_mutex_unlock((pthread_mutex_t *)&p->ctx.error_lock);
  return n;
}

uint64_t sf_pipeline_skipped(const sf_pipeline *p) {
  pthread_mutex_lock((pthread_mutex_t *)&p->ctx.error_lock);
  uint64_t n = p->ctx.skipped;
  pthread_mutex_unlock((pthread_mutex_t *)&p->ctx.error_lock);
  return n;
}

bool sf_pipeline_last_error_printed(const sf_pipeline *p) {
  pthread_mutex_lock((pthread_mutex_t *)&p->ctx.error_lock);
  bool printed = p->ctx.has_error && p->ctx.last_printed;
  pthread_mutex_unlock((pthread_mutex_t *)&p->ctx.error_lock);
  return printed;
}

bool sf_pipeline_last_error(const sf_pipeline *p, sf_error *error) {
  pthread_mutex_lock((pthread_mutex_t *)&p->ctx.error_lock);
  bool has = p->ctx.has_error;
  if (has && error) *error = p->ctx.last_error;
  pthread_mutex_unlock((pthread_mutex_t *)&p->ctx.error_lock);
  return has;
}
