/*
 * A worker's side of a group, what its two files share: the work units and the state one head's pipeline
 * shares with the network loop.  worker_stages.c is the pipeline's two ends (_worker_source feeds the
 * units in, _worker_sink collects each unit's output), worker.c the network loop (engine/group/worker.h).
 */
#ifndef SF_ENGINE_GROUP_WORKER_STATE_H
#define SF_ENGINE_GROUP_WORKER_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "node.h"

enum { SF_WORKER_MAX_PENDING_ERRORS = 64 }; /* error records held for the next message to the head */

/* A work unit at a worker: its input samples, then the samples its stages made of them. */
typedef struct sf_worker_unit {
  uint64_t id;
  sf_sample **in;
  int n_in, next_in;
  sf_sample **out;
  int n_out, cap_out;
  struct sf_worker_unit *next;
} sf_worker_unit;

/* One head's units and records as its pipeline's two ends and the network loop share them (under lock). */
typedef struct sf_worker_state {
  pthread_mutex_t lock;
  sf_worker_unit *inbox, *inbox_tail;       /* received, not yet fed to the pipeline */
  sf_worker_unit *running, *running_tail;   /* fed (the last one maybe in part), waiting for their marker at the sink */
  sf_worker_unit *feeding;                  /* the unit the source is pushing (the tail of running), or NULL */
  sf_worker_unit *outbox, *outbox_tail;     /* done, to be sent */
  int done_fd;                     /* eventfd: the sink finished a unit */
  sf_node *source;
  bool stopping;
  sf_error errors[SF_WORKER_MAX_PENDING_ERRORS];
  int n_errors;
  uint64_t errors_dropped;
  uint64_t filtered_sent;          /* of the stages' filtered samples, reported in results so far */
  bool ring;                       /* results go into a shared-memory ring (set before the pipeline starts) */
} sf_worker_state;

/* Appends u to the list head..tail. */
void sf_worker_unit_append(sf_worker_unit **head, sf_worker_unit **tail, sf_worker_unit *u);
/* Takes the list's first unit off it, or NULL. */
sf_worker_unit *sf_worker_unit_take(sf_worker_unit **head, sf_worker_unit **tail);
/* Frees a unit and the samples it holds (NULL-safe); a whole list. */
void sf_worker_unit_free(sf_worker_unit *u);
void sf_worker_unit_free_list(sf_worker_unit *u);

/*
 * The state the next pipeline's two ends take (their init reads it): set while that head's pipeline is
 * built (sf_pipeline_new), NULL otherwise. Network thread only.
 */
void sf_worker_stages_starting(sf_worker_state *state);

#endif
