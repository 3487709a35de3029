/*
 * A worker's side of a group: its pipeline's two ends, _worker_source -> the group's stages -> _worker_sink.
 * Units enter at the source in arrival order; after a unit's samples the source pushes an epoch-end marker
 * whose epoch is the unit id.  Map stages pass markers through in order (replicas too), so when the sink sees
 * the marker every surviving sample of that unit has arrived: the unit is done and goes to the outbox, which
 * the network loop (worker.c) sends.  The two stages find their head's state in their private struct, set
 * from `starting` while the network loop builds that head's pipeline.
 */
#include <stdlib.h>
#include <unistd.h>

#include "group.h"
#include "shm_ring.h"
#include "worker_state.h"

/* The head whose pipeline the network thread is building: its two stages keep it in their private struct. */
static sf_worker_state *starting;

typedef struct stage_priv {
  sf_worker_state *w;
} stage_priv;

static sf_worker_state *state_of(sf_node *node) { return ((stage_priv *)sf_node_priv(node))->w; }

void sf_worker_stages_starting(sf_worker_state *state) { starting = state; }

void sf_worker_unit_append(sf_worker_unit **head, sf_worker_unit **tail, sf_worker_unit *u) {
  u->next = NULL;
  if (*tail) (*tail)->next = u;
  else *head = u;
  *tail = u;
}

sf_worker_unit *sf_worker_unit_take(sf_worker_unit **head, sf_worker_unit **tail) {
  sf_worker_unit *u = *head;
  if (!u) return NULL;
  *head = u->next;
  if (!*head) *tail = NULL;
  u->next = NULL;
  return u;
}

void sf_worker_unit_free(sf_worker_unit *u) {
  if (!u) return;
  for (int i = 0; i < u->n_in; i++) sf_sample_destroy(&u->in[i]);
  for (int i = 0; i < u->n_out; i++) sf_sample_destroy(&u->out[i]);
  free(u->in);
  free(u->out);
  free(u);
}

void sf_worker_unit_free_list(sf_worker_unit *u) {
  while (u) {
    sf_worker_unit *next = u->next;
    sf_worker_unit_free(u);
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
  sf_worker_state *w = state_of(node);
  pthread_mutex_lock(&w->lock);
  int rc = SF_EAGAIN;
  while (sf_node_output_ready(node)) {
    sf_worker_unit *u = w->feeding;
    if (!u) {
      /* running before its first sample goes: the sink attributes samples to the oldest running unit */
      u = sf_worker_unit_take(&w->inbox, &w->inbox_tail);
      if (!u) break;
      sf_worker_unit_append(&w->running, &w->running_tail, u);
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
  sf_worker_state *w = state_of(node);
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
    sf_worker_unit *u = w->running;
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
    sf_worker_unit *u = sf_worker_unit_take(&w->running, &w->running_tail);
    if (u) sf_worker_unit_append(&w->outbox, &w->outbox_tail, u);
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
