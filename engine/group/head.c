/*
 * A group's head: the stage the engine puts in the head's graph in place of the group's stages (type
 * _group, named after the group).
 *
 * The node cuts its input into work units (up to unit_samples consecutive samples of one shard), hands
 * them to workers over ZeroMQ as they ask for work (credits), and passes the results on in unit order,
 * so the samples leave in exactly the order they came in and the batches do not depend on how many
 * workers there are or which one ran what.  This file is the stage: the group's options, the node's
 * init, step and uninit, and its statistics (workers, their stage tables).  The network thread is
 * head_net.c, the local worker processes head_local.c; engine/group/head.h says what they share.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.h>

#include "files.h"
#include "group.h"
#include "head.h"
#include "log.h"
#include "registry.h"
#include "rendezvous.h"

static const char *const wire_form_names[] = {"auto", "as_written", NULL};

static const sf_option options[] = {
    {"processes", SF_OPT_COUNT, offsetof(sf_head, processes), "0", 0, 256,
     "worker processes the head starts on its own host (connected over ipc://)", NULL},
    {"listen", SF_OPT_STRING, offsetof(sf_head, listen), "", 0, 0,
     "endpoint remote workers connect to: tcp://ADDR:PORT (CURVE unless plaintext) or ipc://PATH", NULL},
    {"secret_key", SF_OPT_STRING, offsetof(sf_head, secret_key), "", 0, 0,
     "the head's key file from `shardflow keygen` (tcp:// listen)", NULL},
    {"allowed_keys", SF_OPT_STRING, offsetof(sf_head, allowed_keys), "", 0, 0,
     "workers admitted on tcp://: a file of public keys (one a line) or a directory of *.pub files", NULL},
    {"plaintext", SF_OPT_BOOL, offsetof(sf_head, plaintext), "false", 0, 0,
     "accept unauthenticated, unencrypted tcp:// connections (trusted networks only)", NULL},
    {"rendezvous", SF_OPT_STRING, offsetof(sf_head, rendezvous), "", 0, 0,
     "a file the head writes once listening (endpoint and public key) and removes at the end; workers started by a "
     "scheduler find the head with `shardflow worker --rendezvous FILE` (needs listen:)",
     NULL},
    {"unit_samples", SF_OPT_COUNT, offsetof(sf_head, unit_samples), "32", 1, 4096,
     "samples in one work unit (a range of one shard); with local processes, a multiple of the batch's "
     "batch_size lets each batch be a view of a worker's shared-memory ring instead of a copy", NULL},
    {"window", SF_OPT_COUNT, offsetof(sf_head, window), "16", 2, 4096,
     "work units the head holds at once (waiting, at workers, or done but not yet passed on)", NULL},
    {"buffer_size", SF_OPT_SIZE, offsetof(sf_head, buffer_size), "256MiB", 1048576, 1099511627776.0,
     "bytes of results the head holds at most; shrinks the window for large samples", NULL},
    {"heartbeat_interval", SF_OPT_DURATION, offsetof(sf_head, heartbeat_interval), "1s", 0.01, 3600,
     "seconds between heartbeats in both directions", NULL},
    {"heartbeat_timeout", SF_OPT_DURATION, offsetof(sf_head, heartbeat_timeout), "5s", 0.05, 86400,
     "seconds of silence after which a worker is dead and its units go to others", NULL},
    {"worker_timeout", SF_OPT_DURATION, offsetof(sf_head, worker_timeout), "0", 0, 864000,
     "fail when work waits this long with no live worker (0 = wait, logging every 10 s)", NULL},
    {"worker_threads", SF_OPT_COUNT, offsetof(sf_head, worker_threads), "0", 0, 1024,
     "threads of each worker's pipeline (0 = the worker's CPUs)", NULL},
    {"worker_command", SF_OPT_STRING, offsetof(sf_head, worker_command), "", 0, 0,
     "the shardflow executable for local processes (default: this one, or $SHARDFLOW_BIN, or shardflow on PATH)",
     NULL},
    {"max_message", SF_OPT_SIZE, offsetof(sf_head, max_message), "256MiB", 65536, 1099511627776.0,
     "largest message accepted from a worker (ZMQ_MAXMSGSIZE)", NULL},
    {"io_threads", SF_OPT_COUNT, offsetof(sf_head, io_threads), "1", 1, 64,
     "ZeroMQ I/O threads of the head: CURVE decryption of each worker's stream runs on one; more than 1 spreads "
     "several workers' streams (refusal counts by kind may then be off by one: monitor events interleave)",
     NULL},
    {"shm_ring", SF_OPT_SIZE, offsetof(sf_head, shm_ring), "64MiB", 0, 1099511627776.0,
     "shared memory each local process writes its results into (the socket then carries only headers); a result "
     "that does not fit goes through the socket; 0 = off",
     NULL},
    {"wire_form", SF_OPT_ENUM, offsetof(sf_head, wire_form), "auto", 0, 0,
     "the form results travel in to the head: auto lets the plan send a last augment's float32/bfloat16 output as "
     "uint8 HWC crops, normalised by an augment it adds on the head (same batches, 4x/2x fewer bytes); as_written "
     "sends what the group's stages make",
     wire_form_names},
    {NULL},
};

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

/* The `listen:` endpoint other hosts' workers connect to, and the rendezvous file that tells them where. */
static int open_listen(sf_node *node, sf_head *r) {
  sf_error e;
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
  return 0;
}

/* `processes:`: the local workers' private socket (in a directory of its own) and the processes themselves. */
static int start_local(sf_node *node, sf_head *r) {
  sf_error e;
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
    rc = sf_head_spawn_worker(r, i, &e);
    if (rc < 0) return start_error(node, &e, rc);
  }
  return 0;
}

static int init(sf_node *node) {
  sf_head *r = sf_node_priv(node);
  r->node = node;
  r->wake_fd = -1;
  pthread_mutex_init(&r->lock, NULL);
  atomic_init(&r->stop, false);
  if (!(r->stages = sf_node_group_stages(node))) {
    sf_node_error(node, SF_EINVAL, NULL, NULL, -1, "a group's head node (%s) is made by the engine from `groups:`",
                  SF_GROUP_HEAD_STAGE);
    return SF_EINVAL;
  }
  if (r->processes == 0 && !r->listen[0]) {
    sf_node_error(node, SF_EOPTION, NULL, NULL, -1,
                  "group '%s' has neither `processes:` nor `listen:`: nothing would run its stages", sf_node_name(node));
    return SF_EOPTION;
  }
  sf_unit_window_new(r->window, r->buffer_size, r->unit_samples, SF_HEAD_MAX_WORKERS, &r->units);
  r->open = calloc((size_t)r->unit_samples, sizeof *r->open);
  r->children = calloc((size_t)(r->processes ? r->processes : 1), sizeof *r->children);
  r->rings = calloc((size_t)(r->processes ? r->processes : 1), sizeof *r->rings);
  r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  r->last_wait_log = sf_head_now(); /* the first "waiting" line after 10 s, not at start */
  r->zctx = zmq_ctx_new();
  if (r->zctx) zmq_ctx_set(r->zctx, ZMQ_IO_THREADS, (int)r->io_threads);
  if (!r->units || !r->open || !r->children || !r->rings || r->wake_fd < 0 || !r->zctx) {
    sf_node_error(node, SF_ENOMEM, NULL, NULL, -1, "out of memory");
    return SF_ENOMEM;
  }
  int rc = open_listen(node, r);
  if (rc == 0 && r->processes > 0) rc = start_local(node, r);
  if (rc < 0) return rc;
  if (pthread_create(&r->thread, NULL, sf_head_network_thread, r) != 0) {
    sf_node_error(node, SF_ENOMEM, NULL, NULL, -1, "cannot start the network thread");
    return SF_ENOMEM;
  }
  r->thread_started = true;
  return 0;
}

/* Moves the open unit into the window. Called with the lock held and a free slot. */
static void close_open_unit(sf_head *r) {
  if (r->n_open == 0) return;
  if (sf_unit_window_add(r->units, r->open, r->n_open) < 0) return; /* the samples stay open; the next step tries again */
  r->n_open = 0;
}

/* Takes input into units while the window has room. Returns true when anything changed. */
static bool take_input(sf_head *r, bool *closed) {
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
static bool deliver(sf_head *r) {
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
  sf_head *r = sf_node_priv(node);
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
  if (closed) sf_head_wake(r);
  if (finished) return SF_EOF;
  return progress ? 0 : SF_EAGAIN;
}

static void uninit(sf_node *node) {
  sf_head *r = sf_node_priv(node);
  if (!r->node) return;
  atomic_store(&r->stop, true);
  if (r->thread_started) {
    sf_head_wake(r);
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

/*
 * The stats callback: the group's counters (the stage table, /metrics, the bottleneck line) and, for
 * sf_pipeline_workers, every worker seen, alive or not, with its own stage table as last reported. Any thread.
 */
static int stats(sf_node *node, sf_stage_stats *x, sf_worker_stats *workers, int max_workers) {
  sf_head *r = sf_node_priv(node);
  pthread_mutex_lock(&r->lock);
  int n_workers = r->units ? r->units->n_workers : 0;
  x->group = true;
  for (int i = 0; i < n_workers; i++) {
    const sf_head_worker *w = &r->workers[i];
    bool alive = sf_head_live(r, i);
    x->workers += alive;
    if (i >= max_workers) continue;
    sf_worker_stats *o = &workers[i];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", w->name);
    o->pid = w->pid;
    o->live = alive;
    o->samples = w->samples;
    o->units = w->units;
    o->rate = alive ? w->rate : 0;
    o->n_stages = w->n_stats < SF_WORKER_STAGES_MAX ? w->n_stats : SF_WORKER_STAGES_MAX;
    for (int j = 0; j < o->n_stages; j++) {
      const sf_wire_stage_stats *from = &w->stats[j];
      sf_worker_stage_stats *to = &o->stages[j];
      snprintf(to->name, sizeof to->name, "%s", from->name);
      to->items = from->items;
      to->bytes = from->bytes;
      to->busy_seconds = (double)from->busy_ns * 1e-9;
      to->wait_seconds = (double)from->wait_ns * 1e-9;
      to->errors = from->errors;
    }
  }
  x->duplicates = r->units ? r->units->duplicates : 0;
  x->malformed = r->malformed;
  x->reassigned = r->units ? r->units->reassigned : 0;
  x->ring_bytes = r->ring_bytes;
  x->socket_bytes = r->socket_bytes;
  for (int s = 0; s < 2; s++)
    if (r->sockets[s]) x->refused += sf_transport_refused(r->sockets[s]);
  pthread_mutex_unlock(&r->lock);
  return n_workers;
}

const sf_stage_def sf_stage_group_head = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = SF_GROUP_HEAD_STAGE,
    .summary = "a group's stages running in worker processes (made by the engine from `groups:`)",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(sf_head),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
    .stats = stats,
};

