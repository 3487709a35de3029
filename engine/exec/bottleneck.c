/* The bottleneck report: one line naming the stage that limits throughput and the remedy (rule: docs/bottleneck.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "node.h"

/* A node summed over its replicas. */
typedef struct judged {
  const sf_node *node;   /* replica 0 */
  double busy;           /* busy seconds over every replica */
  double busy_share;     /* busy / (elapsed * replicas): 1 = every replica stepped all the time */
  sf_node_extra extra;   /* replica 0's, plus the readers' downloads summed */
} judged;

enum { MAX_JUDGED = 64 };

/* Above this busy share a stage is saturated (the rest is scheduling and queue hand-offs). */
static const double SATURATED = 0.5;
/* Below this share of the run waiting in next(), the trainer is what limits throughput. */
static const double TRAINER_BOUND = 0.2;

static int gather(sf_pipeline *p, double elapsed, judged *out) {
  int n, count = 0;
  sf_node *const *nodes = sf_pipeline_nodes(p, &n);
  for (int i = 0; i < n; i++) {
    sf_node *node = nodes[i];
    if (node->replica == 0) {
      if (count == MAX_JUDGED) break;
      memset(&out[count], 0, sizeof out[count]);
      out[count++].node = node;
    }
    judged *j = &out[count - 1];
    j->busy += (double)(atomic_load(&node->busy_ns) + sf_node_deferred_ns(node)) * 1e-9;
    if (node->extra) {
      sf_node_extra x = {0};
      node->extra(node, &x);
      if (node->replica == 0) j->extra = x;
      else if (x.reader) j->extra.downloaded_bytes += x.downloaded_bytes;
      j->extra.reader |= x.reader;
    }
  }
  for (int i = 0; i < count; i++) out[i].busy_share = out[i].busy / (elapsed * out[i].node->replicas);
  return count;
}

static bool is_source(const sf_node *n) { return n->in.n == 0; }

/* How much faster the input must get for the trainer never to wait: it waits `wait` of the time. */
static double speedup(double wait) { return 1.0 / (1.0 - (wait < 0.95 ? wait : 0.95)); }

static int cpus(void) {
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c > 0 ? (int)c : 1;
}

int sf_pipeline_bottleneck(sf_pipeline *p, char *buf, size_t size) {
  return sf_pipeline_bottleneck_named(p, buf, size, NULL);
}

int sf_pipeline_bottleneck_named(sf_pipeline *p, char *buf, size_t size, const char **named) {
  const sf_node *culprit = NULL; /* the node the line names, if any */
  if (named) *named = NULL;
  double elapsed = sf_pipeline_elapsed(p);
  if (elapsed < 1e-3) elapsed = 1e-3;
  double trainer_wait = sf_pipeline_trainer_wait(p) / elapsed;
  judged *js = calloc(MAX_JUDGED, sizeof *js);
  if (!js) return snprintf(buf, size, "bottleneck: unknown (out of memory)");
  int n = gather(p, elapsed, js);
  /* The busiest stage that is not a network reader: what CPU time limits. */
  const judged *cpu = NULL, *reader = NULL, *group = NULL;
  for (int i = 0; i < n; i++) {
    const judged *j = &js[i];
    if (j->extra.reader && (!reader || j->busy_share > reader->busy_share)) reader = j;
    if (j->extra.group && !group) group = j;
    if (j->extra.reader || is_source(j->node)) continue;
    if (!cpu || j->busy_share > cpu->busy_share) cpu = j;
  }
  int len;
  if (trainer_wait < TRAINER_BOUND) {
    len = snprintf(buf, size,
                   "bottleneck: the consumer (the trainer waited for batches %.0f%% of the run; the last stage's "
                   "queue stays full): make the consumer faster; the input pipeline has headroom",
                   trainer_wait * 100);
  } else if (cpu && cpu->busy_share >= SATURATED && !cpu->extra.group) {
    const sf_node *nd = culprit = cpu->node;
    int reps = nd->replicas, have = cpus();
    int want = (int)ceil(reps * speedup(trainer_wait) - 1e-9);
    if (want <= reps) want = reps + 1;
    if (want <= have)
      len = snprintf(buf, size, "bottleneck: %s (%s, busy %.0f%% of %d replica(s)): CPU-bound; set %s.replicas: %d",
                     nd->name, nd->def->name, cpu->busy_share * 100, reps, nd->name, want);
    else {
      char here[96] = ""; /* fill this host first */
      if (reps < have) snprintf(here, sizeof here, "set %s.replicas: %d here, and ", nd->name, have);
      len = snprintf(buf, size,
                     "bottleneck: %s (%s, busy %.0f%% of %d replica(s), %d CPU(s) here): CPU-bound beyond this host; "
                     "%smove it into a group with %d decode worker(s) of %d CPU(s) (`groups:`, `shardflow worker`)",
                     nd->name, nd->def->name, cpu->busy_share * 100, reps, have, here,
                     (int)ceil(cpu->busy / elapsed * speedup(trainer_wait) / have - 1e-9), have);
    }
  } else if (group) {
    uint64_t w = group->extra.workers ? group->extra.workers : 1;
    culprit = group->node;
    len = snprintf(buf, size,
                   "bottleneck: %s (a group with %llu worker(s); the trainer waited %.0f%% of the run): its workers "
                   "decode too slowly; start more `shardflow worker` processes for it (about %d in all)",
                   group->node->name, (unsigned long long)group->extra.workers, trainer_wait * 100,
                   (int)ceil((double)w * speedup(trainer_wait) - 1e-9));
  } else if (reader) {
    const sf_node *nd = culprit = reader->node;
    double rate = (double)reader->extra.downloaded_bytes / elapsed / 1048576.0;
    const sf_node_extra *x = &reader->extra;
    const sf_node_tuned *tuned = x->n_tuned > 0 && !x->tuned[0].pinned ? &x->tuned[0] : NULL;
    if (tuned) /* the tuner already raises prefetch while the reader and the trainer wait: its bound is the budget */
      len = snprintf(buf, size,
                     "bottleneck: %s (%s, network-bound: %.1f MiB/s downloaded while the stages after it waited for "
                     "input): %s.prefetch is tuned while running (now %lld, from %lld) within %s.prefetch_bytes; "
                     "raise prefetch_bytes for more downloads ahead, or cache shards nearer (cache_dir)",
                     nd->name, nd->def->name, rate, nd->name, (long long)tuned->value, (long long)tuned->initial,
                     nd->name);
    else
      len = snprintf(buf, size,
                     "bottleneck: %s (%s, network-bound: %.1f MiB/s downloaded while the stages after it waited for "
                     "input): raise %s.prefetch (now %llu) for more downloads in parallel, or cache shards nearer "
                     "(cache_dir)",
                     nd->name, nd->def->name, rate, nd->name, (unsigned long long)reader->extra.prefetch);
  } else if (cpu) {
    len = snprintf(buf, size,
                   "bottleneck: none saturated (busiest: %s, busy %.0f%%; the trainer waited %.0f%% of the run): the "
                   "input side waits on its sources; look at the shards' storage",
                   cpu->node->name, cpu->busy_share * 100, trainer_wait * 100);
  } else {
    len = snprintf(buf, size, "bottleneck: unknown (no stage has run yet)");
  }
  free(js);
  if (named && culprit) *named = culprit->name;
  return len;
}
