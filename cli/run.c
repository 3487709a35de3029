/* `shardflow run GRAPH`: runs a graph file, prints the reference rate lines and a per-stage table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "graph.h"
#include "node.h"
#include "options.h"
#include "remote.h"
#include "shardflow/shardflow.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: shardflow run GRAPH [--set NODE.OPTION=VALUE]... [--epochs N] [--rank R --world-size W]\n"
          "                           [--start-epoch E --start-step K]\n"
          "                           [--log-steps N] [--step-time S] [--quiet] [--no-summary]\n"
          "\n"
          "Runs GRAPH (a YAML graph file) and consumes its batches as a trainer would.\n"
          "  --set NODE.OPTION=VALUE  override an option (or a setting: --set seed=7)\n"
          "  --epochs N               epochs of the run, counted from epoch 0 (default: the graph's `epochs`)\n"
          "  --rank R, --world-size W this process's rank (default: RANK / WORLD_SIZE, else 0 of 1)\n"
          "  --start-epoch E, --start-step K  resume: epoch E (0-based) after its first K batches;\n"
          "                           the batches are exactly those an uninterrupted run returns next\n"
          "  --log-steps N            print a rate line every N batches (default 100; 0 = never)\n"
          "  --step-time S            sleep S seconds per batch, like a trainer's step (a slow consumer)\n"
          "  --quiet                  only errors and the epoch lines\n"
          "  --no-summary             no per-stage table at the end\n"
          "Rate= is an exponential moving average of samples/s (smoothing 0.4, as torch_xla's\n"
          "RateTracker); GlobalRate= is samples/s since the epoch began. With groups, Workers= is the\n"
          "number of live workers and each worker's samples/s follows its name.\n");
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *clock_text(char *buf, size_t size) {
  time_t t = time(NULL);
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(buf, size, "%H:%M:%S", &tm);
  return buf;
}

/* Appends " Workers=N name=rate ..." for each group's node to the progress line. */
static void print_workers(sf_pipeline *p) {
  sf_node *node = sf_pipeline_find_node(p, &sf_stage_remote);
  if (!node) return;
  static sf_remote_stats st;
  sf_remote_describe(node, &st);
  printf(" Workers=%d", st.live);
  for (int i = 0; i < st.n_workers; i++)
    if (st.workers[i].live) printf(" %s=%.1f", st.workers[i].name, st.workers[i].rate);
}

/* One table per process: the head's nodes, then each worker's stages as it last reported them. */
static void print_summary(sf_pipeline *p) {
  sf_node_stats stats[64];
  int n = sf_pipeline_stats(p, stats, 64);
  if (n > 64) n = 64;
  const char *header = "%-14s %-13s %4s %12s %12s %9s %9s %7s %8s\n";
  fprintf(stderr, "\nhead (pid %d)\n", (int)getpid());
  fprintf(stderr, header, "node", "stage", "reps", "items", "MiB", "busy s", "wait s", "errors", "skipped");
  for (int i = 0; i < n; i++) {
    const sf_node_stats *s = &stats[i];
    fprintf(stderr, "%-14s %-13s %4d %12llu %12.1f %9.2f %9.2f %7llu %8llu\n", s->name, s->type, s->replicas,
            (unsigned long long)s->items, (double)s->bytes / 1048576.0, s->busy_seconds, s->wait_seconds,
            (unsigned long long)s->errors, (unsigned long long)s->skipped);
  }
  sf_node *node = sf_pipeline_find_node(p, &sf_stage_remote);
  if (!node) return;
  static sf_remote_stats st;
  sf_remote_describe(node, &st);
  for (int w = 0; w < st.n_workers; w++) {
    const sf_remote_worker_stats *ws = &st.workers[w];
    fprintf(stderr, "\nworker %s (pid %lld%s): %llu samples in %llu units\n", ws->name, (long long)ws->pid,
            ws->live ? "" : ", gone", (unsigned long long)ws->samples, (unsigned long long)ws->units);
    fprintf(stderr, "%-14s %12s %12s %9s %9s %7s\n", "node", "items", "MiB", "busy s", "wait s", "errors");
    for (int i = 0; i < ws->n_stats; i++) {
      const sf_wire_stage_stats *s = &ws->stats[i];
      fprintf(stderr, "%-14s %12llu %12.1f %9.2f %9.2f %7llu\n", s->name, (unsigned long long)s->items,
              (double)s->bytes / 1048576.0, (double)s->busy_ns * 1e-9, (double)s->wait_ns * 1e-9,
              (unsigned long long)s->errors);
    }
  }
  fprintf(stderr, "\ngroup %s: %llu units reassigned, %llu duplicate results dropped, %llu malformed messages "
          "dropped, %llu connections refused\n", sf_node_name(node), (unsigned long long)st.reassigned,
          (unsigned long long)st.duplicates, (unsigned long long)st.malformed, (unsigned long long)st.refused);
}

int sf_cli_run(int argc, char **argv) {
  const char *path = NULL;
  sf_pipeline_options options;
  sf_pipeline_options_init(&options);
  long log_steps = 100;
  double step_time = 0;
  bool quiet = false, summary = true;
  const char **sets = calloc((size_t)argc, sizeof *sets);
  int n_sets = 0;
  if (!sets) return 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      free(sets);
      return 0;
    } else if (strcmp(a, "--set") == 0 && v) {
      sets[n_sets++] = v;
      i++;
    } else if (strncmp(a, "--set=", 6) == 0) {
      sets[n_sets++] = a + 6;
    } else if (strcmp(a, "--epochs") == 0 && v) {
      int64_t e;
      if (sf_parse_count(v, &e) < 0) goto bad;
      options.epochs = e;
      i++;
    } else if (strcmp(a, "--rank") == 0 && v) {
      int64_t x;
      if (sf_parse_count(v, &x) < 0 || x > 1 << 20) goto bad;
      options.rank = (int)x;
      i++;
    } else if (strcmp(a, "--world-size") == 0 && v) {
      int64_t x;
      if (sf_parse_count(v, &x) < 0 || x < 1 || x > 1 << 20) goto bad;
      options.world_size = (int)x;
      i++;
    } else if (strcmp(a, "--start-epoch") == 0 && v) {
      int64_t x;
      if (sf_parse_count(v, &x) < 0) goto bad;
      options.first_epoch = (uint64_t)x;
      i++;
    } else if (strcmp(a, "--start-step") == 0 && v) {
      int64_t x;
      if (sf_parse_count(v, &x) < 0) goto bad;
      options.first_step = (uint64_t)x;
      i++;
    } else if (strcmp(a, "--log-steps") == 0 && v) {
      log_steps = atol(v);
      i++;
    } else if (strcmp(a, "--step-time") == 0 && v) {
      char *end;
      step_time = strtod(v, &end);
      if (*end || step_time < 0 || step_time > 3600) goto bad;
      i++;
    } else if (strcmp(a, "--quiet") == 0) {
      quiet = true;
    } else if (strcmp(a, "--no-summary") == 0) {
      summary = false;
    } else if (a[0] != '-' && !path) {
      path = a;
    } else {
    bad:
      fprintf(stderr, "shardflow run: bad argument '%s'\n", a);
      usage(stderr);
      free(sets);
      return 2;
    }
  }
  if (!path) {
    usage(stderr);
    free(sets);
    return 2;
  }
  sf_error err;
  char line[2048];
  sf_graph *graph = NULL;
  int r = sf_graph_load_file(&graph, path, &err);
  for (int i = 0; r == 0 && i < n_sets; i++) {
    char target[256];
    const char *eq = strchr(sets[i], '=');
    if (!eq || (size_t)(eq - sets[i]) >= sizeof target) {
      fprintf(stderr, "shardflow run: --set takes NODE.OPTION=VALUE, got '%s'\n", sets[i]);
      sf_graph_destroy(&graph);
      free(sets);
      return 2;
    }
    memcpy(target, sets[i], (size_t)(eq - sets[i]));
    target[eq - sets[i]] = '\0';
    r = sf_graph_set(graph, target, eq + 1, &err);
  }
  free(sets);
  int64_t epochs = options.epochs >= 0 ? options.epochs : graph ? graph->epochs : 0;
  if (r == 0 && epochs > 0 && options.first_epoch >= (uint64_t)epochs) {
    fprintf(stderr, "shardflow run: --start-epoch %llu is past the run's %lld epochs (0..%lld); give --epochs N to "
            "run more\n", (unsigned long long)options.first_epoch, (long long)epochs, (long long)epochs - 1);
    sf_graph_destroy(&graph);
    return 2;
  }
  sf_pipeline *p = NULL;
  if (r == 0) r = sf_pipeline_new(&p, graph, &options, &err);
  sf_graph_destroy(&graph);
  if (r < 0) {
    fprintf(stderr, "shardflow: error: %s\n", sf_error_format(&err, line, sizeof line));
    return 1;
  }
  int rank = sf_pipeline_rank(p);
  char clk[16];
  double epoch_start = now_seconds(), last_time = epoch_start, rate = 0;
  uint64_t samples = 0, last_samples = 0, step = sf_pipeline_step(p);
  uint64_t epoch_seen = sf_pipeline_epoch(p);
  int status = 0;
  for (;;) {
    sf_batch *batch;
    r = sf_pipeline_next(p, &batch, -1);
    if (r == 0) {
      samples += (uint64_t)batch->size;
      step = sf_pipeline_step(p);
      sf_batch_destroy(&batch);
      if (step_time > 0) {
        struct timespec ts = {.tv_sec = (time_t)step_time, .tv_nsec = (long)((step_time - (double)(time_t)step_time) * 1e9)};
        nanosleep(&ts, NULL);
      }
      if (log_steps > 0 && step % (uint64_t)log_steps == 0 && !quiet) {
        double t = now_seconds();
        double instant = (double)(samples - last_samples) / (t - last_time > 1e-9 ? t - last_time : 1e-9);
        rate = rate == 0 ? instant : rate * 0.4 + instant * 0.6;
        last_time = t;
        last_samples = samples;
        printf("| Training Rank=%d Epoch=%llu Step=%llu Rate=%.2f GlobalRate=%.2f Time=%s", rank,
               (unsigned long long)sf_pipeline_epoch(p) + 1, (unsigned long long)step, rate,
               (double)samples / (t - epoch_start), clock_text(clk, sizeof clk));
        print_workers(p);
        printf("\n");
        fflush(stdout);
      }
      continue;
    }
    if (r == SF_EOF) {
      if (sf_pipeline_epoch(p) == epoch_seen) break; /* no epoch ended: the last one is done */
      epoch_seen = sf_pipeline_epoch(p);
      double t = now_seconds();
      unsigned long long epoch = (unsigned long long)epoch_seen; /* already advanced: 1-based */
      printf("| Epoch=%llu Rank=%d Replica Train Samples=%llu Steps=%llu Epoch Time=%.2fs GlobalRate=%.2f\n",
             epoch, rank, (unsigned long long)samples, (unsigned long long)step, t - epoch_start,
             (double)samples / (t - epoch_start > 1e-9 ? t - epoch_start : 1e-9));
      fflush(stdout);
      samples = last_samples = step = 0;
      rate = 0;
      epoch_start = last_time = now_seconds();
      continue;
    }
    status = 1;
    if (sf_pipeline_last_error(p, &err))
      fprintf(stderr, "shardflow: stopped: %s\n", sf_error_format(&err, line, sizeof line));
    else
      fprintf(stderr, "shardflow: stopped: %s\n", sf_strerror(r));
    break;
  }
  uint64_t errors = sf_pipeline_error_count(p), skipped = sf_pipeline_skipped(p);
  if (summary) print_summary(p);
  if (errors || skipped)
    fprintf(stderr, "shardflow: %llu error record(s), %llu sample(s) skipped\n",
            (unsigned long long)errors, (unsigned long long)skipped);
  sf_pipeline_destroy(&p);
  return status;
}
