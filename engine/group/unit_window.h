/*
 * The ordered window of work units a group's head (engine/group/head.c) keeps:
 * which unit is waiting, at which worker, done or an epoch marker; which
 * worker gets the next one; what a result or a lost worker changes.  Pure
 * bookkeeping: no sockets, no threads, no clock (the caller passes `now` in
 * seconds and holds its own lock), so tests drive it step by step.
 */
#ifndef SF_ENGINE_UNIT_WINDOW_H
#define SF_ENGINE_UNIT_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#include "shardflow/sample.h"

/* A unit lost with this many workers is skipped rather than lose more workers. */
enum { SF_UNIT_MAX_ATTEMPTS = 3 };

/* A unit is late after SF_UNIT_LATE_FACTOR times what units take (queueing at the worker included), never
 * sooner than SF_UNIT_LATE_MIN_SECONDS: a false alarm costs one unit's work twice, a missed one stalls the epoch. */
#define SF_UNIT_LATE_FACTOR 4.0
#define SF_UNIT_LATE_MIN_SECONDS 1.0

typedef enum sf_unit_state { SF_UNIT_PENDING, SF_UNIT_AT_WORKER, SF_UNIT_DONE, SF_UNIT_MARKER } sf_unit_state;

/* One slot of the window: a work unit, or an epoch-end marker between units. */
typedef struct sf_unit {
  uint64_t id;
  sf_unit_state state;
  uint64_t epoch;
  sf_sample **in;        /* owned; kept until the result arrives, to hand the unit to another worker */
  int n_in;
  sf_sample **out;       /* owned once SF_UNIT_DONE; the caller takes out[next_out...] as it passes them on */
  int n_out, next_out;
  int worker;            /* who holds it while SF_UNIT_AT_WORKER (after a late hand-on: who held it) */
  int attempts;          /* workers lost while they held it */
  double sent_at;        /* when it last went to a worker */
  bool late;             /* handed to a second worker for being late (once) */
} sf_unit;

/* What the window knows of a worker: enough to choose one and to account for its units. */
typedef struct sf_unit_worker {
  bool live;
  uint32_t credits;      /* units it asked for and has not been sent */
  int in_flight;         /* units it holds */
  bool late;             /* a unit of its was handed on for being late: no more work until it answers */
} sf_unit_worker;

/* Read the fields freely (under the caller's lock); change them only through the functions below. */
typedef struct sf_unit_window {
  int64_t window, buffer_size, unit_samples; /* the group's options */
  sf_unit *units;        /* a ring: units[(head + i) % cap] for i in [0, count) */
  int cap, head, count;
  uint64_t next_id;
  sf_unit_worker *workers;
  int max_workers, n_workers;
  int next_worker;       /* where the round robin of sf_unit_window_choose() goes on */
  double unit_seconds;   /* how long units take from dispatch to result: rises at once, falls slowly */
  double out_bytes_per_sample;
  uint64_t duplicates;   /* results dropped because their unit was done or gone */
  uint64_t reassigned;   /* units handed to another worker after theirs died, left or was late */
} sf_unit_window;

/* What became of a result (sf_unit_window_result). */
typedef enum sf_unit_answer {
  SF_UNIT_TAKEN,         /* the unit is done with these samples */
  SF_UNIT_DUPLICATE,     /* its unit was already done or has left the window: dropped, counted in duplicates */
  SF_UNIT_FOREIGN,       /* samples that are not the unit's (added, reordered): dropped (the caller counts it) */
  SF_UNIT_NO_MEMORY,     /* not taken; the unit stays where it was */
} sf_unit_answer;

/*
 * A window for units of up to unit_samples samples, holding up to `window`
 * units (fewer when results are large: buffer_size bytes at most), and up to
 * max_workers workers.  Returns 0 or SF_ENOMEM; *out is the caller's, freed
 * with sf_unit_window_destroy().
 */
int sf_unit_window_new(int64_t window, int64_t buffer_size, int64_t unit_samples, int max_workers,
                       sf_unit_window **out);

/* Frees the window with every sample still in it; sets *w to NULL. */
void sf_unit_window_destroy(sf_unit_window **w);

/* How many units the window may hold now: the window option, shrunk (to 2 at least) when results are large. */
int sf_unit_window_limit(const sf_unit_window *w);

/* The i-th unit from the oldest (0 <= i < count). Borrowed. */
sf_unit *sf_unit_window_at(sf_unit_window *w, int i);

/* The unit with this id, or NULL once it has left the window (or never was in it). Borrowed. */
sf_unit *sf_unit_window_find(sf_unit_window *w, uint64_t id);

/*
 * Appends a pending unit of samples[0..n) (n >= 1; one shard, consecutive).
 * Returns 0: the samples are the window's (the array stays the caller's);
 * SF_ENOMEM or SF_ETOOBIG (no free slot): nothing changed, the samples
 * stay the caller's.  The caller keeps count below sf_unit_window_limit()
 * (+ 1 for a marker after a unit); the ring has two slots to spare.
 */
int sf_unit_window_add(sf_unit_window *w, sf_sample *const *samples, int n);

/* Appends an epoch-end marker. Returns 0 or SF_ETOOBIG (no free slot). */
int sf_unit_window_add_marker(sf_unit_window *w, uint64_t epoch);

/* Removes the oldest unit (passed on), with any output samples not taken from it. */
void sf_unit_window_pop(sf_unit_window *w);

/* Whether any unit waits for a worker. */
bool sf_unit_window_has_pending(const sf_unit_window *w);

/* A slot for a worker that said hello: live, no credits. Returns its index, or -1 when max_workers are live. */
int sf_unit_window_join(sf_unit_window *w);

/*
 * Worker wi died or left: the units it holds wait for others (each counts
 * one attempt more).  Returns how many, or -1 if wi was not live.
 */
int sf_unit_window_leave(sf_unit_window *w, int wi);

/* Worker wi asks for n units more. */
void sf_unit_window_credit(sf_unit_window *w, int wi, uint32_t n);

/*
 * The next live worker with credit, round robin; one that owes a late unit
 * only when no other live worker answers in time.  Returns -1 if none.
 */
int sf_unit_window_choose(const sf_unit_window *w);

/* Unit u (pending) went to worker wi at time now. */
void sf_unit_window_sent(sf_unit_window *w, sf_unit *u, int wi, double now);

/* Unit u (pending) is given up (SF_UNIT_MAX_ATTEMPTS): done, with no samples. Its input is freed. */
void sf_unit_window_skip(sf_unit_window *w, sf_unit *u);

/*
 * A result for unit `id` of samples[0..n) from worker wi (-1: a worker
 * already declared dead; its result still counts once).  The first result
 * of a unit is taken, whoever sent it; any later one is a duplicate.  On
 * SF_UNIT_TAKEN the samples move into the unit (samples[i] become NULL) and
 * *unit is set; otherwise they stay the caller's.  Either way a worker's
 * answer returns its credit and clears its late mark.
 */
sf_unit_answer sf_unit_window_result(sf_unit_window *w, int wi, uint64_t id, sf_sample **samples, int n, double now,
                                     sf_unit **unit);

/*
 * The next unit held longer than SF_UNIT_LATE_FACTOR times what units take:
 * it waits for a second worker (once per unit) and its worker is marked late.
 * NULL when there is none, no unit has finished yet, or no other worker
 * answers in time.  u->worker and u->sent_at still say who held it since when.
 */
sf_unit *sf_unit_window_next_late(sf_unit_window *w, double now);

#endif
