/* The ordered window of a group's work units (engine/unit_window.h): pure bookkeeping the head's network thread drives. */
#include "unit_window.h"

#include <stdlib.h>
#include <string.h>

#include "shardflow/error.h"
#include "shardflow/tensor.h"

static void free_samples(sf_sample **s, int n) {
  for (int i = 0; i < n; i++) sf_sample_destroy(&s[i]);
  free(s);
}

/* A unit's input is kept until its result is in (or it is skipped); then it goes, count included. */
static void drop_input(sf_unit *u) {
  free_samples(u->in, u->n_in);
  u->in = NULL;
  u->n_in = 0;
}

static void drop_output(sf_unit *u) {
  if (u->out)
    for (int i = u->next_out; i < u->n_out; i++) sf_sample_destroy(&u->out[i]);
  free(u->out);
  u->out = NULL;
  u->n_out = u->next_out = 0;
}

int sf_unit_window_new(int64_t window, int64_t buffer_size, int64_t unit_samples, int max_workers,
                       sf_unit_window **out) {
  *out = NULL;
  sf_unit_window *w = calloc(1, sizeof *w);
  if (!w) return SF_ENOMEM;
  w->window = window;
  w->buffer_size = buffer_size;
  w->unit_samples = unit_samples;
  w->cap = (int)window + 2; /* room for a unit and a marker closed together at the limit */
  w->max_workers = max_workers;
  w->units = calloc((size_t)w->cap, sizeof *w->units);
  w->workers = calloc((size_t)max_workers, sizeof *w->workers);
  if (!w->units || !w->workers) {
    sf_unit_window_destroy(&w);
    return SF_ENOMEM;
  }
  *out = w;
  return 0;
}

void sf_unit_window_destroy(sf_unit_window **w) {
  if (!*w) return;
  while ((*w)->count > 0) sf_unit_window_pop(*w);
  free((*w)->units);
  free((*w)->workers);
  free(*w);
  *w = NULL;
}

int sf_unit_window_limit(const sf_unit_window *w) {
  int64_t limit = w->window;
  if (w->out_bytes_per_sample > 0) {
    double fit = (double)w->buffer_size / (w->out_bytes_per_sample * (double)w->unit_samples);
    if (fit < (double)limit) limit = fit < 2 ? 2 : (int64_t)fit;
  }
  return (int)limit;
}

sf_unit *sf_unit_window_at(sf_unit_window *w, int i) { return &w->units[(w->head + i) % w->cap]; }

sf_unit *sf_unit_window_find(sf_unit_window *w, uint64_t id) {
  for (int i = 0; i < w->count; i++) {
    sf_unit *u = sf_unit_window_at(w, i);
    if (u->state != SF_UNIT_MARKER && u->id == id) return u;
  }
  return NULL;
}

int sf_unit_window_add(sf_unit_window *w, sf_sample *const *samples, int n) {
  if (w->count == w->cap) return SF_ETOOBIG;
  sf_sample **in = malloc((size_t)n * sizeof *in);
  if (!in) return SF_ENOMEM;
  memcpy(in, samples, (size_t)n * sizeof *in);
  sf_unit *u = sf_unit_window_at(w, w->count);
  *u = (sf_unit){.id = w->next_id++, .state = SF_UNIT_PENDING, .epoch = samples[0]->epoch, .in = in, .n_in = n,
                 .worker = -1};
  w->count++;
  return 0;
}

int sf_unit_window_add_marker(sf_unit_window *w, uint64_t epoch) {
  if (w->count == w->cap) return SF_ETOOBIG;
  *sf_unit_window_at(w, w->count) = (sf_unit){.state = SF_UNIT_MARKER, .epoch = epoch, .worker = -1};
  w->count++;
  return 0;
}

void sf_unit_window_pop(sf_unit_window *w) {
  if (w->count == 0) return;
  sf_unit *u = sf_unit_window_at(w, 0);
  drop_input(u);
  drop_output(u);
  w->head = (w->head + 1) % w->cap;
  w->count--;
}

bool sf_unit_window_has_pending(const sf_unit_window *w) {
  for (int i = 0; i < w->count; i++)
    if (w->units[(w->head + i) % w->cap].state == SF_UNIT_PENDING) return true;
  return false;
}

int sf_unit_window_join(sf_unit_window *w) {
  int wi = -1;
  for (int i = 0; i < w->n_workers && wi < 0; i++)
    if (!w->workers[i].live) wi = i;
  if (wi < 0 && w->n_workers < w->max_workers) wi = w->n_workers++;
  if (wi >= 0) w->workers[wi] = (sf_unit_worker){.live = true};
  return wi;
}

int sf_unit_window_leave(sf_unit_window *w, int wi) {
  if (wi < 0 || wi >= w->n_workers || !w->workers[wi].live) return -1;
  w->workers[wi].live = false;
  int requeued = 0;
  for (int i = 0; i < w->count; i++) {
    sf_unit *u = sf_unit_window_at(w, i);
    if (u->state != SF_UNIT_AT_WORKER || u->worker != wi) continue;
    u->state = SF_UNIT_PENDING;
    u->attempts++;
    requeued++;
  }
  w->reassigned += (uint64_t)requeued;
  return requeued;
}

void sf_unit_window_credit(sf_unit_window *w, int wi, uint32_t n) { w->workers[wi].credits += n; }

/* Whether a live worker other than `holder` has answered every unit in time. */
static bool prompt_worker_besides(const sf_unit_window *w, int holder) {
  for (int i = 0; i < w->n_workers; i++)
    if (i != holder && w->workers[i].live && !w->workers[i].late) return true;
  return false;
}

int sf_unit_window_choose(const sf_unit_window *w) {
  bool prompt = prompt_worker_besides(w, -1);
  for (int k = 0; k < w->n_workers; k++) {
    int wi = (w->next_worker + k) % w->n_workers;
    const sf_unit_worker *x = &w->workers[wi];
    if (x->live && x->credits > 0 && !(x->late && prompt)) return wi;
  }
  return -1;
}

void sf_unit_window_sent(sf_unit_window *w, sf_unit *u, int wi, double now) {
  w->workers[wi].credits--;
  w->workers[wi].in_flight++;
  u->state = SF_UNIT_AT_WORKER;
  u->worker = wi;
  u->sent_at = now;
  w->next_worker = wi + 1; /* round robin across calls: every worker with credit gets its turn */
}

void sf_unit_window_skip(sf_unit_window *w, sf_unit *u) {
  (void)w;
  drop_input(u);
  u->state = SF_UNIT_DONE;
}

/* The result's samples must be the unit's own, in order: a worker cannot add or reorder samples. */
static bool result_matches(const sf_unit *u, sf_sample *const *out, int n_out) {
  if (n_out > u->n_in) return false;
  int j = 0;
  for (int i = 0; i < n_out; i++) {
    const sf_sample *s = out[i];
    while (j < u->n_in && !(u->in[j]->shard_index == s->shard_index && u->in[j]->index == s->index &&
                            u->in[j]->pass == s->pass && u->in[j]->epoch == s->epoch))
      j++;
    if (j == u->n_in) return false;
    j++;
  }
  return true;
}

sf_unit_answer sf_unit_window_result(sf_unit_window *w, int wi, uint64_t id, sf_sample **samples, int n, double now,
                                     sf_unit **unit) {
  *unit = NULL;
  sf_unit *u = sf_unit_window_find(w, id);
  bool was_mine = u && u->state == SF_UNIT_AT_WORKER && u->worker == wi;
  if (wi >= 0) {
    w->workers[wi].credits++;
    w->workers[wi].late = false; /* it answers after all */
    if (was_mine) w->workers[wi].in_flight--;
  }
  /* The first result of a unit is the one passed on; a late unit's second copy (or a resend) is dropped here. */
  if (!u || u->state == SF_UNIT_DONE) {
    w->duplicates++;
    return SF_UNIT_DUPLICATE;
  }
  if (!result_matches(u, samples, n)) return SF_UNIT_FOREIGN;
  sf_sample **out = calloc((size_t)(n ? n : 1), sizeof *out);
  if (!out) return SF_UNIT_NO_MEMORY;
  if (u->state == SF_UNIT_AT_WORKER && !was_mine && u->worker >= 0) w->workers[u->worker].in_flight--;
  uint64_t bytes = 0;
  for (int i = 0; i < n; i++) {
    out[i] = samples[i];
    samples[i] = NULL;
    for (int f = 0; f < out[i]->n_fields; f++) bytes += sf_tensor_nbytes(&out[i]->fields[f].tensor);
  }
  u->out = out;
  u->n_out = n;
  u->next_out = 0;
  u->state = SF_UNIT_DONE;
  if (u->sent_at > 0) {
    double took = now - u->sent_at;
    w->unit_seconds = took > w->unit_seconds ? took : 0.95 * w->unit_seconds + 0.05 * took;
  }
  drop_input(u);
  if (n) {
    double per = (double)bytes / n;
    w->out_bytes_per_sample = w->out_bytes_per_sample > 0 ? 0.9 * w->out_bytes_per_sample + 0.1 * per : per;
  }
  *unit = u;
  return SF_UNIT_TAKEN;
}

sf_unit *sf_unit_window_next_late(sf_unit_window *w, double now) {
  if (w->unit_seconds <= 0) return NULL; /* no unit finished yet: nothing to compare with */
  double deadline = SF_UNIT_LATE_FACTOR * w->unit_seconds;
  if (deadline < SF_UNIT_LATE_MIN_SECONDS) deadline = SF_UNIT_LATE_MIN_SECONDS;
  for (int i = 0; i < w->count; i++) {
    sf_unit *u = sf_unit_window_at(w, i);
    if (u->state != SF_UNIT_AT_WORKER || u->late || now - u->sent_at <= deadline) continue;
    if (!prompt_worker_besides(w, u->worker)) return NULL;
    sf_unit_worker *holder = &w->workers[u->worker];
    holder->late = true;
    holder->in_flight--;
    u->late = true;
    u->state = SF_UNIT_PENDING;
    w->reassigned++;
    return u;
  }
  return NULL;
}
