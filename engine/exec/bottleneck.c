/* The bottleneck report: one line naming the stage that limits throughput and the remedy (rule: docs/bottleneck.md). */
#include "bottleneck.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_JUDGED = 64 };

/* Above this busy share a stage is saturated (the rest is scheduling and queue hand-offs). */
static const double SATURATED = 0.5;
/* Below this share of the run waiting in next(), the trainer is what limits throughput. */
static const double TRAINER_BOUND = 0.2;
/* Seconds below which a run is mostly start-up (threads, the first shards, a group's workers): enough to fill this
 * host's CPUs, too little to size decode workers on other hosts (a decode + batch graph of 0.05 s asked for 6-8). */
static const double MIN_JUDGED_RUN = 5.0;

/* A node's busy share: busy / (elapsed * replicas); 1 = every replica stepped all the time. */
static double busy_share(const sf_bottleneck_node *j, double elapsed) { return j->busy / (elapsed * j->replicas); }

/* Of a node's busy seconds, those its reads waited (never more than busy: both come from clocks read apart). */
static double read_seconds(const sf_bottleneck_node *j) { return j->read < j->busy ? j->read : j->busy; }

/* How much faster the input must get for the trainer never to wait: it waits `wait` of the time. */
static double speedup(double wait) { return 1.0 / (1.0 - (wait < 0.95 ? wait : 0.95)); }

/* ", N% of the run in reads" for a reader whose reads took at least 1% of the run, else "". */
static void reads_part(char *out, size_t size, const sf_bottleneck_node *j, double elapsed) {
  double share = read_seconds(j) / elapsed;
  if (j->stats.reads && share >= 0.01)
    snprintf(out, size, ", %.0f%% of the run in reads", share * 100);
  else
    out[0] = '\0';
}

/* A saturated stage the engine runs once (not a map stage, or merging inputs): it is the limit, on one thread. */
static int one_thread(char *buf, size_t size, const sf_bottleneck_node *j, double elapsed) {
  char reads[64], why[48];
  reads_part(reads, sizeof reads, j, elapsed);
  if (j->inputs > 1)
    snprintf(why, sizeof why, "merges %d inputs", j->inputs);
  else
    snprintf(why, sizeof why, "keeps state between samples");
  return snprintf(buf, size,
                  "bottleneck: %s (%s, busy %.0f%% of its one thread%s): CPU-bound; %s %s and cannot run as "
                  "replicas, so it is this graph's limit, on one thread%s",
                  j->name, j->stage, busy_share(j, elapsed) * 100, reads, j->stage, why,
                  j->stats.reads ? "; if its shards are compressed, storing them uncompressed takes the inflating "
                                   "off that thread"
                                 : "");
}

/* A saturated reader whose steps mostly waited in reads: the shards' storage limits it, not its CPU. */
static int storage_bound(char *buf, size_t size, const sf_bottleneck_node *j, double elapsed) {
  char reads[64];
  reads_part(reads, sizeof reads, j, elapsed);
  return snprintf(buf, size,
                  "bottleneck: %s (%s, busy %.0f%% of its one thread%s): I/O-bound: its reads wait for the shards' "
                  "storage (read() and page faults of local files, a pipe: command's output), not for its CPU; "
                  "put the shards on faster storage or in memory (page cache, tmpfs)",
                  j->name, j->stage, busy_share(j, elapsed) * 100, reads);
}

/* A saturated map stage: replicas up to the CPU budget, then a group of decode workers once the run is long enough to
 * tell. */
static int replicas_or_group(char *buf, size_t size, const sf_bottleneck_node *j, double elapsed, double trainer_wait,
                             int have) {
  int reps = j->replicas;
  int want = (int)ceil(reps * speedup(trainer_wait) - 1e-9);
  if (want <= reps) want = reps + 1;
  double share = busy_share(j, elapsed) * 100;
  if (want <= have && reps < have)
    return snprintf(buf, size, "bottleneck: %s (%s, busy %.0f%% of %d replica(s)): CPU-bound; set %s.replicas: %d",
                    j->name, j->stage, share, reps, j->name, want);
  bool judged = elapsed >= MIN_JUDGED_RUN;
  int workers = (int)ceil(j->busy / elapsed * speedup(trainer_wait) / have - 1e-9);
  char here[192]; /* fill this host first */
  if (reps >= have)
    snprintf(here, sizeof here, "it already runs %s per CPU of this process's budget (%d%s)%s",
             reps > have ? "more than one replica" : "one replica", have,
             j->replicas_planned ? ", chosen by the plan" : "", judged ? "" : ", so more replicas would not help");
  else
    snprintf(here, sizeof here, "set %s.replicas: %d%s", j->name, have, judged ? " here" : " (one per CPU here)");
  if (judged)
    return snprintf(buf, size,
                    "bottleneck: %s (%s, busy %.0f%% of %d replica(s), %d CPU(s) here): CPU-bound beyond this host; "
                    "%s%smove it into a group with %d decode worker(s) of %d CPU(s) (`groups:`, `shardflow worker`)",
                    j->name, j->stage, share, reps, have, here, reps >= have ? "; " : ", and ", workers, have);
  return snprintf(buf, size,
                  "bottleneck: %s (%s, busy %.0f%% of %d replica(s), %d CPU(s) here): CPU-bound; %s; the run "
                  "(%.2g s) is too short to judge decode workers on other hosts: judge one of %.0f s or more",
                  j->name, j->stage, share, reps, have, here, elapsed, MIN_JUDGED_RUN);
}

int sf_bottleneck_judge(const sf_bottleneck_run *run, char *buf, size_t size, int *named) {
  if (named) *named = -1;
  double elapsed = run->elapsed < 1e-3 ? 1e-3 : run->elapsed;
  double trainer_wait = run->trainer_wait / elapsed;
  int have = run->cpu_budget > 0 ? run->cpu_budget : 1;
  /* The busiest stage that is not a source or a network reader: what CPU time, or a local reader's reads, limit.
   * A local reader counts with its reads: its one thread is as taken waiting for storage as computing. */
  const sf_bottleneck_node *cpu = NULL, *reader = NULL, *group = NULL, *reads = NULL, *culprit = NULL;
  for (int i = 0; i < run->n_nodes; i++) {
    const sf_bottleneck_node *j = &run->nodes[i];
    if (j->stats.reader && (!reader || busy_share(j, elapsed) > busy_share(reader, elapsed))) reader = j;
    if (j->stats.reads && (!reads || read_seconds(j) > read_seconds(reads))) reads = j;
    if (j->stats.group && !group) group = j;
    if (j->stats.reader || j->source) continue;
    if (!cpu || busy_share(j, elapsed) > busy_share(cpu, elapsed)) cpu = j;
  }
  int len;
  if (trainer_wait < TRAINER_BOUND) {
    len = snprintf(buf, size,
                   "bottleneck: the consumer (the trainer waited for batches %.0f%% of the run; the last stage's "
                   "queue stays full): make the consumer faster; the input pipeline has headroom",
                   trainer_wait * 100);
  } else if (cpu && busy_share(cpu, elapsed) >= SATURATED && !cpu->stats.group) {
    culprit = cpu;
    if (cpu->stats.reads && 2 * read_seconds(cpu) >= cpu->busy)
      len = storage_bound(buf, size, cpu, elapsed);
    else if (!cpu->replicable)
      len = one_thread(buf, size, cpu, elapsed);
    else
      len = replicas_or_group(buf, size, cpu, elapsed, trainer_wait, have);
  } else if (group) {
    uint64_t w = group->stats.workers ? group->stats.workers : 1;
    culprit = group;
    len = snprintf(buf, size,
                   "bottleneck: %s (a group with %llu worker(s); the trainer waited %.0f%% of the run): its workers "
                   "decode too slowly; start more `shardflow worker` processes for it (about %d in all)",
                   group->name, (unsigned long long)group->stats.workers, trainer_wait * 100,
                   (int)ceil((double)w * speedup(trainer_wait) - 1e-9));
  } else if (reader) {
    culprit = reader;
    double rate = (double)reader->stats.downloaded_bytes / elapsed / 1048576.0;
    const sf_stage_stats *x = &reader->stats;
    const sf_stage_tuned *tuned = x->n_tuned > 0 && !x->tuned[0].pinned ? &x->tuned[0] : NULL;
    if (tuned) /* the tuner already raises prefetch while the reader and the trainer wait: its bound is the budget */
      len = snprintf(buf, size,
                     "bottleneck: %s (%s, network-bound: %.1f MiB/s downloaded while the stages after it waited for "
                     "input): %s.prefetch is tuned while running (now %lld, from %lld) within %s.prefetch_bytes; "
                     "raise prefetch_bytes for more downloads ahead, or cache shards nearer (cache_dir)",
                     reader->name, reader->stage, rate, reader->name, (long long)tuned->value,
                     (long long)tuned->initial, reader->name);
    else
      len = snprintf(buf, size,
                     "bottleneck: %s (%s, network-bound: %.1f MiB/s downloaded while the stages after it waited for "
                     "input): raise %s.prefetch (now %llu) for more downloads in parallel, or cache shards nearer "
                     "(cache_dir)",
                     reader->name, reader->stage, rate, reader->name, (unsigned long long)reader->stats.prefetch);
  } else if (cpu) {
    char in_reads[96] = "";
    if (reads && read_seconds(reads) / elapsed >= 0.01)
      snprintf(in_reads, sizeof in_reads, "; %s waited in reads %.0f%% of it", reads->name,
               read_seconds(reads) / elapsed * 100);
    len = snprintf(buf, size,
                   "bottleneck: none saturated (busiest: %s, busy %.0f%%; the trainer waited %.0f%% of the run%s): "
                   "the input side waits on its sources; look at the shards' storage",
                   cpu->name, busy_share(cpu, elapsed) * 100, trainer_wait * 100, in_reads);
  } else {
    len = snprintf(buf, size, "bottleneck: unknown (no stage has run yet)");
  }
  if (named && culprit) *named = (int)(culprit - run->nodes);
  return len;
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
          .inputs = node->n_inputs,
          .source = node->in.n == 0,
      };
    }
    sf_bottleneck_node *j = &out[count - 1];
    j->busy += (double)(atomic_load(&node->busy_ns) + sf_node_deferred_ns(node)) * 1e-9;
    sf_node_stage_stats_add(node, &j->stats, node->replica == 0);
  }
  for (int i = 0; i < count; i++)
    out[i].read = (double)out[i].stats.read_ns * 1e-9;
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
      .cpu_budget = sf_pipeline_cpu_budget(p),
      .nodes = nodes,
  };
  run.n_nodes = gather(p, nodes);
  int culprit;
  int len = sf_bottleneck_judge(&run, buf, size, &culprit);
  if (named && culprit >= 0) *named = nodes[culprit].name;
  free(nodes);
  return len;
}
