/* The node API stages call (pop, push, errors, seeds, epochs) and the shared context. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "graph.h"
#include "lazy.h"
#include "lent_rows.h"
#include "log.h"
#include "node.h"
#include "registry.h"

enum { MAX_PRINTED_ERRORS = 20 };
/* The error rate is noise over the first few samples (one bad sample first would be 100%). */
enum { MIN_SAMPLES_FOR_RATE = 100 };

void sf_context_init(sf_context *ctx) {
  memset(ctx, 0, sizeof *ctx);
  ctx->world_size = 1;
  atomic_init(&ctx->epochs_closed, 0);
  atomic_init(&ctx->stop, false);
  atomic_init(&ctx->samples_read, 0);
  atomic_init(&ctx->over_budget, false);
  ctx->max_error_rate = 1;
  pthread_mutex_init(&ctx->error_lock, NULL);
}

void sf_context_destroy(sf_context *ctx) { pthread_mutex_destroy(&ctx->error_lock); }

/* A stage whose code is the user's: a plugin's, or the python stage's function. */
static bool user_code(const sf_stage_def *def) {
  return def && (sf_registry_stage_plugin(def) || strcmp(def->name, "python") == 0);
}

/* Samples the stage of node n passed on, over all its replicas. */
static uint64_t stage_items(sf_node *n) {
  if (!n->stage_replicas) return atomic_load(&n->items);
  uint64_t items = 0;
  for (int i = 0; i < n->replicas; i++)
    if (n->stage_replicas[i]) items += atomic_load(&n->stage_replicas[i]->items);
  return items;
}

/* sf_context_cause with the error lock held. */
static void cause_locked(sf_context *ctx, char *buf, size_t size, bool *code_wrong) {
  const sf_error *e = &ctx->first_error;
  *code_wrong = false;
  buf[0] = '\0';
  if (!ctx->error_count) return;
  if (ctx->uniform && ctx->first_node && user_code(ctx->first_node->def) && stage_items(ctx->first_node) == 0) {
    *code_wrong = true;
    snprintf(buf, size, "every sample failed in %s with the same error: %s; the stage's code or options are wrong, "
             "not the input", e->stage, e->message[0] ? e->message : sf_strerror(e->code));
    return;
  }
  int n = snprintf(buf, size, "the first: %s", e->stage[0] ? e->stage : "the engine");
  if (e->url[0] && n >= 0 && (size_t)n < size) n += snprintf(buf + n, size - (size_t)n, ": %s", e->url);
  if (e->url[0] && e->line >= 0 && n >= 0 && (size_t)n < size)
    n += snprintf(buf + n, size - (size_t)n, ":%lld", (long long)e->line);
  if (e->offset >= 0 && n >= 0 && (size_t)n < size)
    n += snprintf(buf + n, size - (size_t)n, " @ byte %lld", (long long)e->offset);
  if (e->key[0] && n >= 0 && (size_t)n < size) snprintf(buf + n, size - (size_t)n, " (key %s)", e->key);
}

void sf_context_cause(sf_context *ctx, char *buf, size_t size, bool *code_wrong) {
  pthread_mutex_lock(&ctx->error_lock);
  cause_locked(ctx, buf, size, code_wrong);
  pthread_mutex_unlock(&ctx->error_lock);
}

static int check_budget_locked(sf_context *ctx, bool final) {
  if (atomic_load(&ctx->over_budget)) return SF_EBUDGET;
  uint64_t read = atomic_load(&ctx->samples_read);
  char why[512];
  if (ctx->max_errors && ctx->error_count > ctx->max_errors)
    snprintf(why, sizeof why, "%llu error records, more than max_errors %llu",
             (unsigned long long)ctx->error_count, (unsigned long long)ctx->max_errors);
  else if (read && (final || read >= MIN_SAMPLES_FOR_RATE) && (double)ctx->skipped > ctx->max_error_rate * (double)read)
    snprintf(why, sizeof why, "%llu of %llu samples read were skipped (%.0f%%), more than max_error_rate %g",
             (unsigned long long)ctx->skipped, (unsigned long long)read, 100.0 * (double)ctx->skipped / (double)read,
             ctx->max_error_rate);
  else
    return 0;
  char cause[1024];
  bool code_wrong;
  cause_locked(ctx, cause, sizeof cause, &code_wrong);
  sf_error e;
  /* A verdict, not a record: the records it follows were counted and printed, and this says why the run stops. */
  if (code_wrong)
    sf_error_set(&e, SF_EBUDGET, SF_NOWHERE, "error budget exceeded: %s: %s", why, cause);
  else
    sf_error_set(&e, SF_EBUDGET, SF_NOWHERE,
                 "error budget exceeded: %s (%s); fix the input, or raise the graph's max_errors / max_error_rate "
                 "(or set error_policy: fail to stop at the first error)",
                 why, cause[0] ? cause : "no error record");
  ctx->last_error = e;
  ctx->has_error = true;
  ctx->last_printed = false;
  ctx->verdict = true;
  atomic_store(&ctx->over_budget, true);
  return SF_EBUDGET;
}

int sf_context_check_budget(sf_context *ctx, bool final) {
  pthread_mutex_lock(&ctx->error_lock);
  int r = check_budget_locked(ctx, final);
  pthread_mutex_unlock(&ctx->error_lock);
  return r;
}

/* Counts e, raised by node (or NULL); returns what to log for it: 0 nothing, 1 its line, 2 its line and that printing stops. */
static int record_locked(sf_context *ctx, const sf_error *e, sf_node *node) {
  if (ctx->error_count++ == 0) {
    ctx->first_error = *e;
    ctx->first_node = node;
    ctx->uniform = true;
  } else if (ctx->uniform) {
    const sf_error *f = &ctx->first_error;
    ctx->uniform = e->code == f->code && strcmp(e->stage, f->stage) == 0 && strcmp(e->message, f->message) == 0;
  }
  int print = 0;
  if (!ctx->quiet && ctx->printed < MAX_PRINTED_ERRORS) print = ++ctx->printed == MAX_PRINTED_ERRORS ? 2 : 1;
  /* Records of steps still running once the run stopped (a map thread, read-ahead) keep the reason it stopped. */
  if (!ctx->verdict && !atomic_load(&ctx->stop)) {
    ctx->last_error = *e;
    ctx->has_error = true;
    ctx->last_printed = print != 0;
  }
  if (ctx->on_record) ctx->on_record(ctx->on_record_opaque, e);
  check_budget_locked(ctx, false);
  return print;
}

static void record(sf_context *ctx, const sf_error *e, sf_node *node) {
  pthread_mutex_lock(&ctx->error_lock);
  int print = record_locked(ctx, e, node);
  pthread_mutex_unlock(&ctx->error_lock);
  /* Logged outside the lock: a log handler may ask the pipeline for its counts. */
  if (print) {
    sf_error where = *e; /* the stage is the record's own argument; the rest of the line its message */
    where.stage[0] = '\0';
    char line[2048];
    sf_log(SF_LOG_ERROR, e->stage, "%s", sf_error_format(&where, line, sizeof line));
  }
  /* Front-end neutral: the CLI's end line and Python's stats() give the counts. */
  if (print == 2) sf_log(SF_LOG_WARNING, NULL, "further errors are counted but not printed");
}

void sf_context_record(sf_context *ctx, const sf_error *e) { record(ctx, e, NULL); }

void sf_context_set_verdict(sf_context *ctx, const sf_error *e) {
  pthread_mutex_lock(&ctx->error_lock);
  ctx->last_error = *e;
  ctx->has_error = true;
  ctx->last_printed = false;
  ctx->verdict = true;
  pthread_mutex_unlock(&ctx->error_lock);
}

void *sf_node_priv(sf_node *n) { return n->priv; }

void *sf_node_attachment(const sf_node *n) { return n && n->graph_node ? n->graph_node->attachment : NULL; }
const char *sf_node_name(const sf_node *n) { return n->name; }
int sf_node_replica(const sf_node *n) { return n->replica; }
int sf_node_replicas(const sf_node *n) { return n->replicas; }
bool sf_node_may_defer(const sf_node *n) { return n->may_defer; }

bool sf_node_option_written(const sf_node *n, const char *option) {
  return sf_graph_node_value(n->graph_node, option) != NULL;
}
uint64_t sf_node_epochs(const sf_node *n) { return n->ctx->epochs; }
uint64_t sf_node_first_epoch(const sf_node *n) { return n->ctx->first_epoch; }
uint64_t sf_node_first_step(const sf_node *n) { return n->ctx->first_step; }
int sf_node_rank(const sf_node *n) { return n->ctx->rank; }
int sf_node_world_size(const sf_node *n) { return n->ctx->world_size; }

uint64_t sf_node_seed_named(const sf_node *n, const char *name) { return sf_graph_node_seed(n->ctx->seed, name); }

uint64_t sf_node_seed(const sf_node *n) { return sf_node_seed_named(n, n->name); }

void sf_node_close_epoch(sf_node *n, uint64_t epoch) {
  atomic_uint_fast64_t *closed = n->branch_closed ? n->branch_closed : &n->ctx->epochs_closed;
  uint64_t want = epoch + 1, cur = atomic_load(closed);
  while (cur < want && !atomic_compare_exchange_weak(closed, &cur, want)) {
  }
}

uint64_t sf_node_epochs_closed(const sf_node *n) {
  uint64_t all = atomic_load(&n->ctx->epochs_closed), branch = n->branch_closed ? atomic_load(n->branch_closed) : 0;
  return all > branch ? all : branch;
}

bool sf_node_cancelled(const sf_node *n) { return atomic_load(&n->ctx->stop); }

/* The stage that splits shards into samples: what it reads is the error rate's denominator. */
static bool splits_shards(const sf_node *n) {
  return sf_port_first_kind(n->def->inputs) == SF_PORT_SHARD && sf_port_first_kind(n->def->outputs) == SF_PORT_SAMPLE;
}

void sf_node_count_output(sf_node *n, uint64_t items, uint64_t bytes) {
  atomic_fetch_add_explicit(&n->items, items, memory_order_relaxed);
  atomic_fetch_add_explicit(&n->bytes, bytes, memory_order_relaxed);
  if (splits_shards(n)) atomic_fetch_add_explicit(&n->ctx->samples_read, items, memory_order_relaxed);
}

void sf_node_count_filtered(sf_node *n, uint64_t samples) {
  atomic_fetch_add_explicit(&n->filtered, samples, memory_order_relaxed);
}

void sf_node_count_skipped(sf_node *n, uint64_t samples) {
  atomic_fetch_add_explicit(&n->skipped, samples, memory_order_relaxed);
  if (splits_shards(n)) atomic_fetch_add_explicit(&n->ctx->samples_read, samples, memory_order_relaxed);
  pthread_mutex_lock(&n->ctx->error_lock);
  n->ctx->skipped += samples;
  check_budget_locked(n->ctx, false);
  pthread_mutex_unlock(&n->ctx->error_lock);
}

int sf_node_error(sf_node *n, int code, const char *url, const char *key, int64_t offset, const char *fmt, ...) {
  sf_error e;
  va_list ap;
  va_start(ap, fmt);
  sf_error_setv(&e, code, SF_AT(.stage = n->name, .url = url, .key = key, .offset = offset), fmt, ap);
  va_end(ap);
  return sf_node_error_record(n, &e);
}

int sf_node_option_error(sf_node *n, const char *option, const char *fmt, ...) {
  char text[sizeof ((sf_error *)0)->message];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (option)
    sf_node_error(n, SF_EOPTION, NULL, NULL, -1, "option %s: %s", option, text);
  else
    sf_node_error(n, SF_EOPTION, NULL, NULL, -1, "%s", text);
  return SF_EOPTION; /* whatever the policy: a node cannot run with options it refuses */
}

void sf_node_log(const sf_node *n, sf_log_level level, const char *fmt, ...) {
  char text[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  int flags = (int)level & SF_LOG_UNPREFIXED, plain = (int)level & ~SF_LOG_UNPREFIXED;
  if (plain != SF_LOG_ERROR && plain != SF_LOG_WARNING && plain != SF_LOG_INFO) plain = SF_LOG_WARNING;
  sf_log(plain | flags, n->name, "%s", text);
}

/* A counter name: 1..31 bytes of a-z, 0-9 and _, a letter first (a /metrics label value, a JSON key, one word of the table). */
static bool counter_name_ok(const char *name) {
  size_t len = name ? strlen(name) : 0;
  if (len == 0 || len >= SF_COUNTER_NAME_MAX || name[0] < 'a' || name[0] > 'z') return false;
  for (size_t i = 0; i < len; i++)
    if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') || name[i] == '_')) return false;
  return true;
}

/* New names are rare (a node's first calls): one lock for every node keeps the node small. */
static pthread_mutex_t counter_lock = PTHREAD_MUTEX_INITIALIZER;

int sf_node_counter_add(sf_node *n, const char *name, uint64_t delta) {
  if (!name) return SF_EINVAL;
  int count = atomic_load_explicit(&n->n_counters, memory_order_acquire);
  for (int i = 0; i < count; i++)
    if (strcmp(n->counter_names[i], name) == 0) {
      atomic_fetch_add_explicit(&n->counters[i], delta, memory_order_relaxed);
      return 0;
    }
  if (!counter_name_ok(name)) return SF_EINVAL;
  pthread_mutex_lock(&counter_lock);
  count = atomic_load_explicit(&n->n_counters, memory_order_relaxed);
  int i = 0;
  while (i < count && strcmp(n->counter_names[i], name) != 0) i++; /* another thread may have added it */
  if (i == count && count < SF_NODE_COUNTERS) {
    snprintf(n->counter_names[i], sizeof n->counter_names[i], "%s", name);
    atomic_store_explicit(&n->counters[i], 0, memory_order_relaxed);
    atomic_store_explicit(&n->n_counters, count + 1, memory_order_release);
  }
  pthread_mutex_unlock(&counter_lock);
  if (i == SF_NODE_COUNTERS) return SF_ETOOBIG;
  atomic_fetch_add_explicit(&n->counters[i], delta, memory_order_relaxed);
  return 0;
}

int sf_node_error_record(sf_node *n, const sf_error *e) {
  atomic_fetch_add_explicit(&n->errors, 1, memory_order_relaxed);
  record(n->ctx, e, n);
  return n->ctx->error_policy == SF_POLICY_FAIL ? e->code : 0;
}

/*
 * Several queues fed in round-robin order: read them in the same order; an epoch end counts once all have it.
 * Holes (SF_ITEM_NONE) are returned from a single queue, as a replica must pass them on (sf_node_pop),
 * and skipped where the round-robin readers merge the queues again.
 */
static int pop_port(sf_port *p, sf_item *item) {
  if (p->n == 1) {
    int r = sf_queue_pop(p->queues[0], item);
    if (r == 0 && item->kind != SF_ITEM_EPOCH_END) p->position++;
    return r;
  }
  for (;;) {
    int r = sf_queue_pop(p->queues[p->rr], item);
    if (r < 0) return r;
    p->rr = (p->rr + 1) % p->n;
    if (item->kind != SF_ITEM_EPOCH_END) p->position++;
    if (item->kind == SF_ITEM_NONE) continue;
    if (item->kind != SF_ITEM_EPOCH_END) return 0;
    if (++p->markers < p->n) continue;
    p->markers = 0;
    return 0;
  }
}

/* Returns 0, or SF_ENOMEM when an item was lost (the queue could not grow). */
static int push_port(sf_port *p, sf_item *item) {
  if (p->n == 1) return sf_queue_push(p->queues[0], item);
  int r = 0;
  if (item->kind == SF_ITEM_EPOCH_END) {
    for (int i = 0; i < p->n; i++) {
      sf_item copy = *item;
      r |= sf_queue_push(p->queues[i], &copy);
    }
    item->kind = SF_ITEM_NONE;
    return r ? SF_ENOMEM : 0;
  }
  r = sf_queue_push(p->queues[p->rr], item);
  p->rr = (p->rr + 1) % p->n;
  return r;
}

/* Nothing is lost silently: an item the queue could not take is an error record. */
static void push_or_report(sf_node *n, sf_item *item) {
  bool sample = item->kind == SF_ITEM_SAMPLE;
  if (push_port(&n->out, item) == 0) return;
  sf_node_error(n, SF_ENOMEM, NULL, NULL, -1, "out of memory: an item on the way out of this node was dropped");
  if (sample) sf_node_count_skipped(n, 1);
}

bool sf_port_can_push(sf_port *p) { return p->n == 0 || sf_queue_can_push(p->queues[p->rr]); }

int sf_node_pop(sf_node *n, sf_item *item) {
  if (n->in.n == 0) return SF_EOF;
  bool map = n->def->flags & SF_STAGE_MAP;
  for (;;) {
    int r = pop_port(&n->in, item);
    if (r < 0) return r;
    if (item->kind == SF_ITEM_NONE) {
      /* A replica is one lane of several: the hole keeps the lanes in step down to where they merge. */
      if (map && n->replicas > 1) {
        n->out_items++;
        if (sf_queue_push(n->out.queues[0], item) < 0)
          sf_node_error(n, SF_ENOMEM, NULL, NULL, -1, "out of memory: order of replicas lost");
      }
      continue;
    }
    if (map && item->kind == SF_ITEM_EPOCH_END) {
      push_or_report(n, item); /* map stages keep no state: the marker passes straight on */
      continue;
    }
    if (map) n->popped++;
    return 0;
  }
}

int sf_node_input_count(const sf_node *n) { return n->n_inputs; }

int sf_node_pop_port(sf_node *n, int port, sf_item *item) {
  if (port == 0) return sf_node_pop(n, item);
  if (port < 0 || port >= n->n_inputs) return SF_EOF;
  for (;;) {
    int r = pop_port(&n->more_in[port - 1], item);
    if (r < 0 || item->kind != SF_ITEM_NONE) return r; /* holes only keep replicas in step */
  }
}

void sf_node_count_input(sf_node *n, int port, uint64_t items) {
  if (port >= 0 && port < SF_GRAPH_MAX_INPUTS)
    atomic_fetch_add_explicit(&n->input_items[port], items, memory_order_relaxed);
}

/* A plugin's recipe, wrapped so that its writes are charged to the node that made it. */
typedef struct timed_recipe {
  sf_field_recipe base;
  sf_field_recipe *inner;
  sf_lazy_clock *clock;
} timed_recipe;

static void timed_write(const sf_field_recipe *recipe, void *dst) {
  const timed_recipe *t = (const timed_recipe *)recipe;
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  t->inner->write(t->inner, dst);
  clock_gettime(CLOCK_MONOTONIC, &b);
  sf_lazy_clock_charge(t->clock, (uint64_t)((b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec)));
}

static void timed_destroy(sf_field_recipe *recipe) {
  timed_recipe *t = (timed_recipe *)recipe;
  t->inner->destroy(t->inner);
  sf_lazy_clock_unref(t->clock);
  free(t);
}

/*
 * Charges the time the sample's new deferred fields take to write to this node: the lazy module's own
 * kinds get the node's clock in their description; a plugin's recipe is wrapped. Only metrics: out of
 * memory leaves them as they are.
 */
static void time_deferred(sf_node *n, sf_sample *s) {
  if (!n->deferred) return;
  for (int i = 0; i < s->n_fields; i++) {
    sf_field *f = &s->fields[i];
    if (!f->recipe || f->recipe->write == timed_write || sf_lazy_adopt(f, n->deferred)) continue;
    timed_recipe *t = malloc(sizeof *t);
    if (!t) return;
    *t = (timed_recipe){.base = {.write = timed_write, .destroy = timed_destroy}, .inner = f->recipe,
                        .clock = sf_lazy_clock_ref(n->deferred)};
    f->recipe = &t->base;
  }
}

int sf_node_new_deferred(sf_node *n) { return (n->deferred = sf_lazy_clock_new()) ? 0 : SF_ENOMEM; }

const sf_graph *sf_node_group_stages(const sf_node *n) { return n->group_stages; }

uint64_t sf_node_deferred_ns(const sf_node *n) { return sf_lazy_clock_ns(n->deferred); }
uint64_t sf_thread_deferred_ns(void) { return sf_lazy_thread_ns(); }

void sf_node_release_deferred(sf_node *n) {
  sf_lazy_clock_unref(n->deferred);
  n->deferred = NULL;
  sf_lent_rows_free(n->lends);
  n->lends = NULL;
}

/*
 * Stream positions name the rows a consumer lends: a sample's place in what the consumer pops (samples and
 * holes, not epoch markers). On the consumer, the item it popped last. On a producer, the output it makes
 * now, its out_items-th (holes included): replica r of R is every R-th of what its consumer pops, which reads
 * the replicas' queues in turn, so that is position out_items * R + r.
 */
static uint64_t popped_position(const sf_node *n) { return n->in.position - 1; }

static uint64_t output_position(const sf_node *n) {
  return n->out_items * (uint64_t)(n->replicas > 1 ? n->replicas : 1) + (uint64_t)n->replica;
}

int sf_node_lend_rows(sf_node *n, sf_pool *pool, int64_t rows) {
  if (n->lends || n->in.n == 0 || rows < 1) return 0;
  if (!(n->lends = sf_lent_rows_new(pool, rows))) return SF_ENOMEM;
  for (int i = 0; i < n->in.n; i++) n->in.queues[i]->lender = n->lends;
  return 0;
}

int sf_node_borrow_row(sf_node *n, sf_dtype dtype, int ndim, const int64_t *shape, sf_tensor *row) {
  if (n->out.n != 1 || !n->out.queues[0]->lender) return 0;
  return sf_lent_rows_borrow(n->out.queues[0]->lender, output_position(n), dtype, ndim, shape, row);
}

void sf_node_row_placed(sf_node *n, int64_t at) {
  if (n->lends && n->in.position) sf_lent_rows_placed(n->lends, popped_position(n), at);
}

void sf_node_push(sf_node *n, sf_item *item) {
  if (item->kind == SF_ITEM_NONE) return;
  if (item->kind == SF_ITEM_SAMPLE && n->pipeline) time_deferred(n, item->u.sample);
  if (n->out.n == 0) {
    sf_item_clear(item);
    return;
  }
  if (item->kind == SF_ITEM_SAMPLE || item->kind == SF_ITEM_BATCH) n->pushed++, n->out_items++;
  push_or_report(n, item);
}

bool sf_node_output_ready(const sf_node *n) { return sf_port_can_push((sf_port *)&n->out); }

/* A map stage's step: the engine pops, passes markers on, counts, and applies the error policy (stage.h). */
static int map_step(sf_node *n) {
  sf_item item;
  int r = sf_node_pop(n, &item);
  if (r < 0) return r;
  if (item.kind != SF_ITEM_SAMPLE) { /* an epoch marker of a stage without SF_STAGE_MAP */
    sf_node_push(n, &item);
    return 0;
  }
  uint64_t errors = atomic_load_explicit(&n->errors, memory_order_relaxed);
  r = n->def->map(n, &item.u.sample);
  if (r == 0 && item.u.sample) {
    uint64_t bytes = sf_item_nbytes(&item);
    sf_node_push(n, &item);
    sf_node_count_output(n, 1, bytes);
    return 0;
  }
  if (r > 0) { /* outside the contract: a bug in the stage, and still no sample may vanish without a record */
    const sf_sample *s = item.u.sample;
    sf_node_error(n, SF_EINVAL, s ? sf_sample_url(s) : NULL, s ? s->key : NULL, s ? s->offset : -1,
                  "map returned %d, a positive code (stage type %s): map returns 0, or a negative SF_E code after "
                  "sf_node_error(); the sample is dropped: a bug in the stage, fix its map",
                  r, n->def->name);
    r = SF_EINVAL;
  }
  sf_item_clear(&item);
  if (r == 0) { /* dropped on purpose: a filter, not an error */
    sf_node_count_filtered(n, 1);
    return 0;
  }
  bool reported = atomic_load_explicit(&n->errors, memory_order_relaxed) != errors;
  if (r < 0 && (!reported || n->ctx->error_policy == SF_POLICY_FAIL)) return r;
  sf_node_count_skipped(n, 1);
  return 0;
}

int sf_node_step(sf_node *n) {
  n->popped = n->pushed = 0;
  int r = n->def->map ? map_step(n) : n->def->step(n);
  if ((n->def->flags & SF_STAGE_MAP) && n->out.n) {
    /* A dropped sample leaves a hole so round-robin readers stay in step. */
    for (; n->pushed < n->popped; n->pushed++) {
      sf_item hole = {.kind = SF_ITEM_NONE};
      n->out_items++;
      sf_queue *q = n->out.queues[n->out.n == 1 ? 0 : n->out.rr];
      if (n->out.n > 1) n->out.rr = (n->out.rr + 1) % n->out.n;
      if (sf_queue_push(q, &hole) < 0) sf_node_error(n, SF_ENOMEM, NULL, NULL, -1, "out of memory: order of replicas lost");
    }
  }
  return r;
}

void sf_node_stage_stats_add(sf_node *node, sf_stage_stats *sum, bool first) {
  if (first) memset(sum, 0, sizeof *sum);
  if (!node->def->stats) return;
  sf_stage_stats x = {0};
  node->def->stats(node, &x, NULL, 0);
  if (first) {
    *sum = x;
    return;
  }
  sum->reads |= x.reads;
  sum->read_ns += x.read_ns;
  sum->reader |= x.reader;
  sum->downloaded_bytes += x.downloaded_bytes;
  sum->refetched_bytes += x.refetched_bytes;
  sum->retries += x.retries;
  sum->cache_hits += x.cache_hits;
}
