/* `shardflow run`'s live reports: the one-line progress bar on a TTY and --stats-json's JSON lines. */
#include "cli/progress.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "node.h"

uint64_t sf_cli_epoch_length(const sf_graph *graph) {
  uint64_t source = 0;
  for (int i = 0; i < sf_graph_node_count(graph); i++) {
    const char *type = sf_graph_node_type(graph, i), *v = sf_graph_node_option(graph, i, "samples_per_epoch");
    uint64_t n = v ? strtoull(v, NULL, 10) : 0;
    if (n && strcmp(type, "mix") == 0) return n; /* a mix cuts the epoch whatever its sources say */
    if (n && strcmp(type, "shard_source") == 0) source = n;
  }
  return source;
}

static void put_duration(FILE *out, double s) {
  long t = (long)(s + 0.5);
  if (t >= 3600)
    fprintf(out, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    fprintf(out, "%ld:%02ld", t / 60, t % 60);
}

void sf_cli_progress_bar(FILE *out, sf_pipeline *p, const sf_cli_progress *pr) {
  enum { WIDTH = 24 };
  fputc('\r', out);
  if (pr->epoch_length) {
    double done = (double)pr->samples / (double)pr->epoch_length;
    int fill = done >= 1 ? WIDTH : (int)(done * WIDTH);
    fputc('[', out);
    for (int i = 0; i < WIDTH; i++) fputc(i < fill ? '#' : '.', out);
    fprintf(out, "] %llu/%llu samples", (unsigned long long)pr->samples, (unsigned long long)pr->epoch_length);
  } else {
    fprintf(out, "%llu samples", (unsigned long long)pr->samples);
  }
  fprintf(out, "  %.1f samples/s", pr->rate);
  if (pr->epoch_length && pr->rate > 0) {
    fputs("  ETA ", out);
    put_duration(out, pr->samples >= pr->epoch_length ? 0 : (double)(pr->epoch_length - pr->samples) / pr->rate);
  }
  fprintf(out, "  epoch %llu step %llu", (unsigned long long)pr->epoch, (unsigned long long)pr->step);
  static sf_node_stats stats[64]; /* large; the CLI reports from one thread */
  int n = sf_pipeline_stats(p, stats, 64);
  for (int i = 0; i < n && i < 64; i++)
    if (stats[i].stage.group) fprintf(out, "  workers %llu", (unsigned long long)stats[i].stage.workers);
  fputs("\033[K", out);
  fflush(out);
}

/* Items and MiB per second over seconds (0 when no time has passed). */
static void put_rates(json_t *o, uint64_t items, uint64_t bytes, double seconds) {
  double s = seconds > 1e-9 ? seconds : 0;
  json_object_set_new(o, "items_per_second", json_real(s ? (double)items / s : 0));
  json_object_set_new(o, "mib_per_second", json_real(s ? (double)bytes / 1048576.0 / s : 0));
}

static json_t *node_record(const sf_node_stats *s, double seconds) {
  json_t *o = json_pack("{s:s, s:s, s:i, s:I, s:I, s:f, s:f, s:I, s:I, s:I}", "name", s->name, "type", s->type,
                        "replicas", s->replicas, "items", (json_int_t)s->items, "bytes", (json_int_t)s->bytes,
                        "busy_seconds", s->busy_seconds, "wait_seconds", s->wait_seconds, "errors",
                        (json_int_t)s->errors, "skipped", (json_int_t)s->skipped, "filtered", (json_int_t)s->filtered);
  if (!o) return NULL;
  put_rates(o, s->items, s->bytes, seconds);
  if (s->n_inputs > 1) { /* a mix: what each input gave, as the stage table's "<-" lines */
    json_t *in = json_object();
    for (int j = 0; j < s->n_inputs && j < SF_NODE_INPUTS_MAX; j++)
      json_object_set_new(in, s->input_names[j], json_integer((json_int_t)s->input_items[j]));
    json_object_set_new(o, "inputs", in);
  }
  const sf_stage_stats *x = &s->stage;
  if (x->n_tuned > 0) { /* what the tuner chose, and when */
    json_t *t = json_object();
    for (int j = 0; j < x->n_tuned && j < SF_STAGE_TUNED_MAX; j++)
      json_object_set_new(t, x->tuned[j].option,
                          json_pack("{s:I, s:I, s:b, s:I, s:f}", "value", (json_int_t)x->tuned[j].value, "initial",
                                    (json_int_t)x->tuned[j].initial, "pinned", x->tuned[j].pinned, "changes",
                                    (json_int_t)x->tuned[j].changes, "changed_at", x->tuned[j].changed_at));
    json_object_set_new(o, "tuned", t);
  }
  if (s->n_counters > 0) { /* the stage's own counters (sf_node_counter_add), as the table's lines under its row */
    json_t *counters = json_object();
    for (int j = 0; j < s->n_counters; j++)
      json_object_set_new(counters, s->counter_names[j], json_integer((json_int_t)s->counters[j]));
    json_object_set_new(o, "counters", counters);
  }
  return o;
}

static json_t *group_record(sf_pipeline *p, const sf_node_stats *group, double seconds) {
  static sf_worker_stats ws[64]; /* large; the CLI reports from one thread */
  int n = sf_pipeline_workers(p, group->name, ws, 64);
  json_t *workers = json_array();
  for (int w = 0; w < n && w < 64; w++) {
    json_t *stages = json_array();
    for (int i = 0; i < ws[w].n_stages; i++) {
      const sf_worker_stage_stats *s = &ws[w].stages[i];
      json_t *o = json_pack("{s:s, s:I, s:I, s:f, s:f, s:I}", "name", s->name, "items", (json_int_t)s->items, "bytes",
                            (json_int_t)s->bytes, "busy_seconds", s->busy_seconds, "wait_seconds", s->wait_seconds,
                            "errors", (json_int_t)s->errors);
      if (o) put_rates(o, s->items, s->bytes, seconds);
      json_array_append_new(stages, o);
    }
    json_array_append_new(workers, json_pack("{s:s, s:I, s:b, s:I, s:I, s:f, s:o}", "name", ws[w].name, "pid",
                                             (json_int_t)ws[w].pid, "live", ws[w].live, "samples",
                                             (json_int_t)ws[w].samples, "units", (json_int_t)ws[w].units, "rate",
                                             ws[w].rate, "stages", stages));
  }
  return json_pack("{s:s, s:i, s:o, s:I, s:I}", "name", group->name, "live_workers", (int)group->stage.workers,
                   "workers", workers, "reassigned", (json_int_t)group->stage.reassigned, "duplicates",
                   (json_int_t)group->stage.duplicates);
}

int sf_cli_stats_record(FILE *out, sf_pipeline *p, const sf_cli_progress *pr, bool final) {
  static sf_node_stats stats[64]; /* large; the CLI reports from one thread */
  int n = sf_pipeline_stats(p, stats, 64);
  if (n > 64) n = 64;
  json_t *nodes = json_array(), *groups = json_array();
  for (int i = 0; i < n; i++) {
    json_array_append_new(nodes, node_record(&stats[i], pr->run_seconds));
    if (stats[i].stage.group) json_array_append_new(groups, group_record(p, &stats[i], pr->run_seconds));
  }
  char bottleneck[512];
  const char *culprit; /* the node the line names, for `shardflow dot` to mark */
  sf_pipeline_bottleneck_named(p, bottleneck, sizeof bottleneck, &culprit);
  json_t *r = json_pack("{s:b, s:f, s:I, s:I, s:I, s:I, s:f, s:f, s:o, s:o, s:s}", "final", final, "elapsed_seconds",
                        pr->run_seconds, "epoch", (json_int_t)pr->epoch, "step", (json_int_t)pr->step, "samples",
                        (json_int_t)pr->samples, "total_samples", (json_int_t)pr->total_samples, "rate", pr->rate,
                        "global_rate", pr->epoch_seconds > 1e-9 ? (double)pr->samples / pr->epoch_seconds : 0.0,
                        "nodes", nodes, "groups", groups, "bottleneck", bottleneck);
  if (!r) return -1;
  json_object_set_new(r, "epoch_length", pr->epoch_length ? json_integer((json_int_t)pr->epoch_length) : json_null());
  json_object_set_new(r, "bottleneck_node", culprit ? json_string(culprit) : json_null());
  json_object_set_new(r, "order_fingerprint", json_string(sf_pipeline_order_fingerprint(p)));
  int rc = json_dumpf(r, out, JSON_COMPACT) < 0 || fputc('\n', out) == EOF || fflush(out) == EOF ? -1 : 0;
  json_decref(r);
  return rc;
}
