/* The bottleneck report: one line naming the stage that limits throughput and the remedy (rule: docs/bottleneck.md). */
#include "bottleneck.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_JUDGED = 64 };

/* Above this busy share a stage is saturated (the rest is scheduling and queue hand-offs). */
static const double SATURATED = 0.5;
/* Below this share of the run waiting in next(), the trainer is what limits throughput. */
static const double TRAINER_BOUND = 0.2;

/* A node's busy share: busy / (elapsed * replicas); 1 = every replica stepped all the time. */
static double busy_share(const sf_bottleneck_node *j, double elapsed) { return j->busy / (elapsed * j->replicas); }

/* How much faster the input must get for the trainer never to wait: it waits `wait` of the time. */
static double speedup(double wait) { return 1.0 / (1.0 - (wait < 0.95 ? wait : 0.95)); }

int sf_bottleneck_judge(const sf_bottleneck_run *run, char *buf, size_t size, int *named) {
  if (named) *named = -1;
  double elapsed = run->elapsed < 1e-3 ? 1e-3 : run->elapsed;
  double trainer_wait = run->trainer_wait / elapsed;
  int have = run->cpu_budget > 0 ? run->cpu_budget : 1;
  /* The busiest stage that is not a network reader: what CPU time limits. */
  const sf_bottleneck_node *cpu = NULL, *reader = NULL, *group = NULL, *culprit = NULL;
  for (int i = 0; i < run->n_nodes; i++) {
    const sf_bottleneck_node *j = &run->nodes[i];
    if (j->extra.reader && (!reader || busy_share(j, elapsed) > busy_share(reader, elapsed))) reader = j;
    if (j->extra.group && !group) group = j;
    if (j->extra.reader || j->source) continue;
    if (!cpu || busy_share(j, elapsed) > busy_share(cpu, elapsed)) cpu = j;
  }
  int len;
  if (trainer_wait < TRAINER_BOUND) {
    len = snprintf(buf, size,
                   "bottleneck: the consumer (the trainer waited for batches %.0f%% of the run; the last stage's "
                   "queue stays full): make the consumer faster; the input pipeline has headroom",
                   trainer_wait * 100);
  } else if (cpu && busy_share(cpu, elapsed) >= SATURATED && !cpu->extra.group) {
    culprit = cpu;
    int reps = cpu->replicas;
    int want = (int)ceil(reps * speedup(trainer_wait) - 1e-9);
    if (want <= reps) want = reps + 1;
    if (want <= have)
      len = snprintf(buf, size, "bottleneck: %s (%s, busy %.0f%% of %d replica(s)): CPU-bound; set %s.replicas: %d",
                     cpu->name, cpu->stage, busy_share(cpu, elapsed) * 100, reps, cpu->name, want);
    else {
      char here[96] = ""; /* fill this host first */
      if (reps < have) snprintf(here, sizeof here, "set %s.replicas: %d here, and ", cpu->name, have);
      len = snprintf(buf, size,
                     "bottleneck: %s (%s, busy %.0f%% of %d replica(s), %d CPU(s) here): CPU-bound beyond this host; "
                     "%smove it into a group with %d decode worker(s) of %d CPU(s) (`groups:`, `shardflow worker`)",
                     cpu->name, cpu->stage, busy_share(cpu, elapsed) * 100, reps, have, here,
                     (int)ceil(cpu->busy / elapsed * speedup(trainer_wait) / have - 1e-9), have);
    }
  } else if (group) {
    uint64_t w = group->extra.workers ? group->extra.workers : 1;
    culprit = group;
    len = snprintf(buf, size,
                   "bottleneck: %s (a group with %llu worker(s); the trainer waited %.0f%% of the run): its workers "
                   "decode too slowly; start more `shardflow worker` processes for it (about %d in all)",
                   group->name, (unsigned long long)group->extra.workers, trainer_wait * 100,
                   (int)ceil((double)w * speedup(trainer_wait) - 1e-9));
  } else if (reader) {
    culprit = reader;
    double rate = (double)reader->extra.downloaded_bytes / elapsed / 1048576.0;
    len = snprintf(buf, size,
                   "bottleneck: %s (%s, network-bound: %.1f MiB/s downloaded while the stages after it waited for "
                   "input): raise %s.prefetch (now %llu) for more downloads in parallel, or cache shards nearer "
                   "(cache_dir)",
                   reader->name, reader->stage, rate, reader->name, (unsigned long long)reader->extra.prefetch);
  } else if (cpu) {
    len = snprintf(buf, size,
                   "bottleneck: none saturated (busiest: %s, busy %.0f%%; the trainer waited %.0f%% of the run): the "
                   "input side waits on its sources; look at the shards' storage",
                   cpu->name, busy_share(cpu, elapsed) * 100, trainer_wait * 100);
  } else {
    len = snprintf(buf, size, "bottleneck: unknown (no stage has run yet)");
  }
  if (named && culprit) *named = (int)(culprit - run->nodes);
  return len;
}

static int cpus(void) {
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c > 0 ? (int)c : 1;
}

/* The pipeline's nodes summed over their replicas into out (MAX_JUDGED of them); their count. */
static int gather(sf_pipeline *p, sf_bottleneck_node *out) {
  int n, count = 0;
  sf_node *const *nodes = sf_pipeline_nodes(p, &n);
  for (int i = 0; i < n; i++) {
    sf_node *node = nodes[i];
    if (node->replica == 0) {
      if (count == MAX_JUDGED) break;
      out[count++] = (sf_bottleneck_node){
          .name = node->name,
          .stage = node->def->name,
          .replicas = node->replicas,
          .replicas_planned = node->replicas_planned,
          .replicable = (node->def->flags & SF_STAGE_MAP) && node->n_inputs <= 1,
          .source = node->in.n == 0,
      };
    }
    sf_bottleneck_node *j = &out[count - 1];
    j->busy += (double)(atomic_load(&node->busy_ns) + sf_node_deferred_ns(node)) * 1e-9;
    if (node->extra) {
      sf_node_extra x = {0};
      node->extra(node, &x);
      if (node->replica == 0) j->extra = x;
      else if (x.reader) j->extra.downloaded_bytes += x.downloaded_bytes;
      j->extra.reader |= x.reader;
    }
  }
  return count;
}

int sf_pipeline_bottleneck(sf_pipeline *p, char *buf, size_t size) {
  return sf_pipeline_bottleneck_named(p, buf, size, NULL);
}

int sf_pipeline_bottleneck_named(sf_pipeline *p, char *buf, size_t size, const char **named) {
  if (named) *named = NULL;
  sf_bottleneck_node *nodes = calloc(MAX_JUDGED, sizeof *nodes);
  if (!nodes) return snprintf(buf, size, "bottleneck: unknown (out of memory)");
  sf_bottleneck_run run = {
      .elapsed = sf_pipeline_elapsed(p),
      .trainer_wait = sf_pipeline_trainer_wait(p),
      .cpu_budget = cpus(),
      .nodes = nodes,
  };
  run.n_nodes = gather(p, nodes);
  int culprit;
  int len = sf_bottleneck_judge(&run, buf, size, &culprit);
  if (named && culprit >= 0) *named = nodes[culprit].name;
  free(nodes);
  return len;
}
