/* `shardflow run GRAPH`: runs a graph file, prints the reference rate lines and a per-stage table. */
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/progress.h"
#include "graph.h"
#include "graph_plan.h"
#include "node.h"
#include "options.h"
#include "shardflow/shardflow.h"

typedef struct run_args {
  sf_cli_list sets;
  char *metrics; /* HOST:PORT, or NULL */
  char *stats_json; /* --stats-json FILE, or NULL */
  char *start_fingerprint; /* --start-fingerprint HEX, or NULL */
  int64_t epochs, rank, world_size, start_epoch, start_step, log_steps; /* -1: not given */
  double step_time;
  bool quiet, no_summary, explain;
} run_args;

static const sf_cli_option run_options[] = {
    {.row = {"set", SF_OPT_STRING, offsetof(run_args, sets),
             .help = "override a node's option, or a graph setting (--set seed=7)"},
     .value = "NODE.OPTION=VALUE",
     .repeat = true},
    {.row = {"epochs", SF_OPT_COUNT, offsetof(run_args, epochs),
             .help = "epochs of the run, counted from epoch 0 (default: the graph's `epochs`)"},
     .value = "N"},
    {.row = {"rank", SF_OPT_COUNT, offsetof(run_args, rank), NULL, 0, 1 << 20,
             "this process's rank (default: RANK, else 0)"},
     .value = "R"},
    {.row = {"world-size", SF_OPT_COUNT, offsetof(run_args, world_size), NULL, 1, 1 << 20,
             "how many ranks there are (default: WORLD_SIZE, else 1)"},
     .value = "W"},
    {.row = {"start-epoch", SF_OPT_COUNT, offsetof(run_args, start_epoch), "0",
             .help = "resume at epoch E (0-based): the batches are exactly those an uninterrupted run returns next"},
     .value = "E"},
    {.row = {"start-step", SF_OPT_COUNT, offsetof(run_args, start_step), "0",
             .help = "resume after the first K batches of the start epoch"},
     .value = "K"},
    {.row = {"start-fingerprint", SF_OPT_STRING, offsetof(run_args, start_fingerprint),
             .help = "resume only if the graph's order fingerprint is HEX (the order_fingerprint of the stopped run's "
                     "--stats-json records): another seed, shard list, batch size... would repeat or skip samples"},
     .value = "HEX"},
    {.row = {"log-steps", SF_OPT_COUNT, offsetof(run_args, log_steps), "100",
             .help = "print a rate line every N batches; 0 = never"},
     .value = "N"},
    {.row = {"step-time", SF_OPT_DURATION, offsetof(run_args, step_time), "0", 0, 3600,
             "sleep this long per batch, like a trainer's step (a slow consumer)"},
     .value = "SECONDS"},
    {.row = {"metrics", SF_OPT_STRING, offsetof(run_args, metrics),
             .help = "serve Prometheus metrics on http://HOST:PORT/metrics (a PORT alone: on 127.0.0.1, this host "
                     "only; port 0: a free one, logged); the graph setting `metrics`"},
     .value = "HOST:PORT"},
    {.row = {"stats-json", SF_OPT_STRING, offsetof(run_args, stats_json),
             .help = "write JSON lines for machines to FILE: a record every --log-steps batches and one at the end "
                     "(format: docs/stats-json.md)"},
     .value = "FILE"},
    {.row = {"quiet", SF_OPT_BOOL, offsetof(run_args, quiet), .help = "only errors and the epoch lines"}},
    {.row = {"no-summary", SF_OPT_BOOL, offsetof(run_args, no_summary), .help = "no per-stage table at the end"}},
    {.row = {"explain", SF_OPT_BOOL, offsetof(run_args, explain),
             .help = "print the plan (each node's replicas and why, the form fields take on each edge) and exit "
                     "without running"}},
    {.row = {NULL}},
};

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
  static sf_node_stats stats[64];
  static sf_worker_stats workers[64]; /* large; the CLI reports from one thread */
  int n = sf_pipeline_stats(p, stats, 64);
  for (int i = 0; i < n && i < 64; i++) {
    if (!stats[i].stage.group) continue;
    printf(" Workers=%llu", (unsigned long long)stats[i].stage.workers);
    int k = sf_pipeline_workers(p, stats[i].name, workers, 64);
    for (int w = 0; w < k && w < 64; w++)
      if (workers[w].live) printf(" %s=%.1f", workers[w].name, workers[w].rate);
  }
}

/* The tables of a group's workers, each process's own stages as it last reported them, and the group's counts. */
static void print_group(sf_pipeline *p, const sf_node_stats *group) {
  static sf_worker_stats workers[64]; /* large; the CLI reports from one thread */
  int k = sf_pipeline_workers(p, group->name, workers, 64);
  for (int w = 0; w < k && w < 64; w++) {
    const sf_worker_stats *ws = &workers[w];
    fprintf(stderr, "\nworker %s (pid %lld%s): %llu samples in %llu units\n", ws->name, (long long)ws->pid,
            ws->live ? "" : ", gone", (unsigned long long)ws->samples, (unsigned long long)ws->units);
    fprintf(stderr, "%-14s %12s %12s %9s %9s %7s\n", "node", "items", "MiB", "busy s", "wait s", "errors");
    for (int i = 0; i < ws->n_stages; i++) {
      const sf_worker_stage_stats *s = &ws->stages[i];
      fprintf(stderr, "%-14s %12llu %12.1f %9.2f %9.2f %7llu\n", s->name, (unsigned long long)s->items,
              (double)s->bytes / 1048576.0, s->busy_seconds, s->wait_seconds, (unsigned long long)s->errors);
    }
  }
  const sf_stage_stats *st = &group->stage;
  fprintf(stderr, "\ngroup %s: %llu units reassigned, %llu duplicate results dropped, %llu malformed messages "
          "dropped, %llu connections refused\n", group->name, (unsigned long long)st->reassigned,
          (unsigned long long)st->duplicates, (unsigned long long)st->malformed, (unsigned long long)st->refused);
}

/* One table per process: the head's nodes, then each worker's stages as it last reported them. */
static void print_summary(sf_pipeline *p) {
  static sf_node_stats stats[64]; /* large; the CLI reports from one thread */
  int n = sf_pipeline_stats(p, stats, 64);
  if (n > 64) n = 64;
  const char *header = "%-14s %-13s %4s %12s %12s %9s %9s %7s %8s %8s\n";
  fprintf(stderr, "\nhead (pid %d)\n", (int)getpid());
  fprintf(stderr, header, "node", "stage", "reps", "items", "MiB", "busy s", "wait s", "errors", "skipped", "filtered");
  for (int i = 0; i < n; i++) {
    const sf_node_stats *s = &stats[i];
    fprintf(stderr, "%-14s %-13s %4d %12llu %12.1f %9.2f %9.2f %7llu %8llu %8llu\n", s->name, s->type, s->replicas,
            (unsigned long long)s->items, (double)s->bytes / 1048576.0, s->busy_seconds, s->wait_seconds,
            (unsigned long long)s->errors, (unsigned long long)s->skipped, (unsigned long long)s->filtered);
    for (int j = 0; s->n_inputs > 1 && j < s->n_inputs && j < SF_NODE_INPUTS_MAX; j++) /* a mix: what each input gave */
      fprintf(stderr, "  <- %-25s %12llu\n", s->input_names[j], (unsigned long long)s->input_items[j]);
    for (int j = 0; j < s->stage.n_tuned && j < SF_STAGE_TUNED_MAX; j++) { /* what the tuner chose, and when */
      const sf_stage_tuned *u = &s->stage.tuned[j];
      if (u->pinned)
        fprintf(stderr, "  %s %lld (written: not tuned)\n", u->option, (long long)u->value);
      else if (u->changes == 0)
        fprintf(stderr, "  %s %lld (tuned: kept)\n", u->option, (long long)u->value);
      else
        fprintf(stderr, "  %s %lld (tuned from %lld: %llu change(s), the last at %.1f s)\n", u->option,
                (long long)u->value, (long long)u->initial, (unsigned long long)u->changes, u->changed_at);
    }
    for (int j = 0; j < s->n_counters; j++) /* the stage's own counters (sf_node_counter_add) */
      fprintf(stderr, "     %-25s %12llu\n", s->counter_names[j], (unsigned long long)s->counters[j]);
  }
  for (int i = 0; i < n; i++)
    if (stats[i].stage.group) print_group(p, &stats[i]);
}

/* SIGUSR1 asks for the bottleneck line; the main loop prints it between batches (not in the handler). */
static volatile sig_atomic_t bottleneck_asked;
static void ask_bottleneck(int sig) { bottleneck_asked = 1; }

static void print_bottleneck(sf_pipeline *p) {
  char line[512];
  sf_pipeline_bottleneck(p, line, sizeof line);
  fprintf(stderr, "%s\n", line);
}

/* Applies the --set overrides in order. 0, or the exit status once it said which one is wrong. */
static int apply_sets(sf_graph *graph, const sf_cli_list *sets) {
  sf_error err;
  char line[2048];
  for (int i = 0; i < sets->n; i++) {
    const char *set = sets->v[i];
    char target[256];
    const char *eq = strchr(set, '=');
    if (!eq || (size_t)(eq - set) >= sizeof target) {
      fprintf(stderr, "shardflow run: --set takes NODE.OPTION=VALUE, got '%s'\n", set);
      return 2;
    }
    memcpy(target, set, (size_t)(eq - set));
    target[eq - set] = '\0';
    if (sf_graph_set(graph, target, eq + 1, &err) < 0) {
      /* the engine's message is the front end's to place: here, the --set that gave it */
      fprintf(stderr, "shardflow run: --set %s: %s\n", set, sf_error_format(&err, line, sizeof line));
      return 1;
    }
  }
  return 0;
}

/* Checks that --start-epoch is inside the run and that --start-fingerprint (want, or NULL) is this graph's.
 * 0; 2 once it said why not; or a negative error in *err when the fingerprint cannot be computed. */
static int check_resume(const sf_graph *graph, const sf_pipeline_options *options, const char *want, sf_error *err) {
  int64_t epochs = options->epochs >= 0 ? options->epochs : graph->epochs;
  if (epochs > 0 && options->first_epoch >= (uint64_t)epochs) {
    fprintf(stderr, "shardflow run: --start-epoch %llu is past the run's %lld epochs (0..%lld); give --epochs N to "
            "run more\n", (unsigned long long)options->first_epoch, (long long)epochs, (long long)epochs - 1);
    return 2;
  }
  if (!want) return 0;
  char fingerprint[SF_ORDER_FINGERPRINT_SIZE];
  int r = sf_graph_order_fingerprint(graph, fingerprint, sizeof fingerprint, err);
  if (r < 0) return r;
  if (strcasecmp(want, fingerprint) != 0) {
    fprintf(stderr, "shardflow run: --start-fingerprint %s is not this graph's order fingerprint %s: the position was "
            "saved by a graph whose seed, shard list, batch_size or another option that decides the order differs "
            "(docs/resume.md), and resuming it here would repeat or skip samples; run the graph and --set options it "
            "was saved with, or start the next epoch\n", want, fingerprint);
    return 2;
  }
  return 0;
}

/* What the run loop counts and prints: rate lines, or a progress bar on a terminal, and --stats-json records. */
typedef struct run_loop {
  sf_pipeline *p;
  FILE *stats; /* --stats-json, or NULL */
  int64_t log_steps;
  double step_time;
  bool quiet, tty, bar_shown; /* tty: a progress bar instead of the rate lines */
  int rank;
  double epoch_start, last_time, rate, run_start, last_draw;
  uint64_t samples, last_samples, step, epoch_seen;
  sf_cli_progress pr;
} run_loop;

/* Counts a batch (and frees it), sleeps --step-time, then prints the rate line, bar or stats record when due. */
static void loop_batch(run_loop *l, sf_batch *batch) {
  sf_pipeline *p = l->p;
  int size = batch->size;
  l->samples += (uint64_t)size;
  l->step = sf_pipeline_step(p);
  sf_batch_destroy(&batch);
  if (l->step_time > 0) {
    struct timespec ts = {.tv_sec = (time_t)l->step_time,
                          .tv_nsec = (long)((l->step_time - (double)(time_t)l->step_time) * 1e9)};
    nanosleep(&ts, NULL);
  }
  double t = now_seconds();
  bool log_now = l->log_steps > 0 && l->step % (uint64_t)l->log_steps == 0, draw = l->tty && t - l->last_draw >= 0.2;
  if (log_now || draw) {
    double instant = (double)(l->samples - l->last_samples) / (t - l->last_time > 1e-9 ? t - l->last_time : 1e-9);
    l->rate = l->rate == 0 ? instant : l->rate * 0.4 + instant * 0.6;
    l->last_time = t;
    l->last_samples = l->samples;
  }
  l->pr = (sf_cli_progress){sf_pipeline_epoch(p) + 1, l->step, l->samples, l->pr.total_samples + (uint64_t)size,
                            l->pr.epoch_length, l->rate, t - l->epoch_start, t - l->run_start};
  if (draw) {
    sf_cli_progress_bar(stdout, p, &l->pr);
    l->last_draw = t;
    l->bar_shown = true;
  }
  if (log_now && l->stats) sf_cli_stats_record(l->stats, p, &l->pr, false);
  if (log_now && !l->quiet && !l->tty) {
    char clk[16];
    printf("| Training Rank=%d Epoch=%llu Step=%llu Rate=%.2f GlobalRate=%.2f Time=%s", l->rank,
           (unsigned long long)sf_pipeline_epoch(p) + 1, (unsigned long long)l->step, l->rate,
           (double)l->samples / (t - l->epoch_start), clock_text(clk, sizeof clk));
    print_workers(p);
    printf("\n");
    fflush(stdout);
  }
}

/* SF_EOF from the pipeline: an epoch ended, so print its line and count the next from zero. false when no epoch
 * ended: the last one is done. */
static bool loop_epoch_end(run_loop *l) {
  if (sf_pipeline_epoch(l->p) == l->epoch_seen) return false;
  l->epoch_seen = sf_pipeline_epoch(l->p);
  double t = now_seconds();
  unsigned long long epoch = (unsigned long long)l->epoch_seen; /* already advanced: 1-based */
  if (l->bar_shown) printf("\r\033[K"); /* the epoch line replaces the bar */
  l->bar_shown = false;
  if (!l->pr.epoch_length) l->pr.epoch_length = l->samples; /* the next epoch is as long, unless the graph said */
  printf("| Epoch=%llu Rank=%d Replica Train Samples=%llu Steps=%llu Epoch Time=%.2fs GlobalRate=%.2f\n", epoch,
         l->rank, (unsigned long long)l->samples, (unsigned long long)l->step, t - l->epoch_start,
         (double)l->samples / (t - l->epoch_start > 1e-9 ? t - l->epoch_start : 1e-9));
  fflush(stdout);
  l->samples = l->last_samples = l->step = 0;
  l->rate = 0;
  l->epoch_start = l->last_time = now_seconds();
  return true;
}

/* Says what stopped the run (r: what sf_pipeline_next returned). */
static void report_stop(sf_pipeline *p, int r, const sf_pipeline_options *options) {
  sf_error err;
  char line[2048];
  bool has = sf_pipeline_last_error(p, &err);
  if (sf_pipeline_last_error_printed(p)) /* the record that stopped the run was printed above: not again */
    fprintf(stderr, "shardflow: stopped by the error above");
  else
    fprintf(stderr, "shardflow: stopped: %s", has ? sf_error_format(&err, line, sizeof line) : sf_strerror(r));
  /* The engine's text is the same for every front end; what the CLI was told is for the CLI to add. */
  if (has && err.code == SF_EOPTION && options->first_step > 0)
    fprintf(stderr, " (resumed with --start-epoch %llu --start-step %llu)", (unsigned long long)options->first_epoch,
            (unsigned long long)options->first_step);
  fprintf(stderr, "\n");
}

/* Takes batches until the last epoch ends (0) or an error stops the run (1). */
static int loop_run(run_loop *l, const sf_pipeline_options *options) {
  struct sigaction usr1 = {.sa_handler = ask_bottleneck};
  sigaction(SIGUSR1, &usr1, NULL);
  for (;;) {
    sf_batch *batch;
    /* A timeout, so that SIGUSR1 is answered while the pipeline is stuck too. */
    int r = sf_pipeline_next(l->p, &batch, 0.2);
    if (bottleneck_asked) {
      bottleneck_asked = 0;
      print_bottleneck(l->p);
    }
    if (r == SF_ETIMEDOUT && !sf_pipeline_failed(l->p)) continue; /* not the error that stopped the run */
    if (r == 0) {
      loop_batch(l, batch);
      continue;
    }
    if (r == SF_EOF) {
      if (loop_epoch_end(l)) continue;
      return 0;
    }
    report_stop(l->p, r, options);
    return 1;
  }
}

/* The end of a run: the last --stats-json record, the per-stage table and the count of errors and skips. */
static int finish_run(run_loop *l, const char *stats_path, bool summary, int status) {
  sf_pipeline *p = l->p;
  if (l->bar_shown) printf("\r\033[K");
  if (l->stats) {
    l->pr.run_seconds = now_seconds() - l->run_start;
    int w = sf_cli_stats_record(l->stats, p, &l->pr, true);
    if (fclose(l->stats) != 0 || w < 0) {
      fprintf(stderr, "shardflow run: --stats-json %s: %s\n", stats_path, strerror(errno));
      status = 1;
    }
  }
  uint64_t errors = sf_pipeline_error_count(p), skipped = sf_pipeline_skipped(p);
  if (summary) print_summary(p);
  if (summary) print_bottleneck(p);
  if (errors || skipped)
    fprintf(stderr, "shardflow: %llu error record(s), %llu sample(s) skipped\n", (unsigned long long)errors,
            (unsigned long long)skipped);
  return status;
}

static int run_main(int argc, char **argv) {
  run_args a = {.epochs = -1, .rank = -1, .world_size = -1};
  int first, status;
  if (!sf_cli_parse(&sf_cli_run, argc, argv, &a, &first, &status)) {
    sf_cli_free(&sf_cli_run, &a);
    return status;
  }
  if (argc - first != 1) {
    sf_cli_free(&sf_cli_run, &a);
    if (argc == first) return sf_cli_usage_error(&sf_cli_run, "give a GRAPH file");
    return sf_cli_usage_error(&sf_cli_run, "takes one GRAPH (got %d operands)", argc - first);
  }
  sf_pipeline_options options;
  sf_pipeline_options_init(&options);
  options.epochs = a.epochs;
  options.rank = (int)a.rank;
  options.world_size = (int)a.world_size;
  options.first_epoch = (uint64_t)a.start_epoch;
  options.first_step = (uint64_t)a.start_step;
  run_loop l = {.log_steps = a.log_steps, .step_time = a.step_time, .quiet = a.quiet};
  bool summary = !a.no_summary, explain = a.explain;
  const char *stats_path = a.stats_json; /* points into argv */
  const char *want_fingerprint = a.start_fingerprint; /* points into argv */
  sf_error err;
  char line[2048];
  sf_graph *graph = NULL;
  int r = sf_graph_load_file(&graph, argv[first], &err);
  if (r == 0 && (status = apply_sets(graph, &a.sets)) != 0) {
    sf_graph_destroy(&graph);
    sf_cli_free(&sf_cli_run, &a);
    return status;
  }
  if (r == 0 && a.metrics) r = sf_graph_set(graph, "metrics", a.metrics, &err);
  sf_cli_free(&sf_cli_run, &a);
  if (r == 0 && explain) {
    r = sf_graph_explain(graph, stdout, &err);
    sf_graph_destroy(&graph);
    if (r == 0) return 0;
    fprintf(stderr, "shardflow: error: %s\n", sf_error_format(&err, line, sizeof line));
    return 1;
  }
  if (r == 0 && (r = check_resume(graph, &options, want_fingerprint, &err)) > 0) {
    sf_graph_destroy(&graph);
    return r;
  }
  l.pr.epoch_length = r == 0 ? sf_cli_epoch_length(graph) : 0;
  if (r == 0) r = sf_pipeline_new(&l.p, graph, &options, &err);
  sf_graph_destroy(&graph);
  if (r < 0) {
    fprintf(stderr, "shardflow: error: %s\n", sf_error_format(&err, line, sizeof line));
    return 1;
  }
  l.stats = stats_path ? fopen(stats_path, "w") : NULL;
  if (stats_path && !l.stats) {
    fprintf(stderr, "shardflow run: --stats-json %s: %s; give a file in a writable directory\n", stats_path,
            strerror(errno));
    sf_pipeline_destroy(&l.p);
    return 2;
  }
  l.tty = !l.quiet && isatty(STDOUT_FILENO);
  l.rank = sf_pipeline_rank(l.p);
  l.epoch_start = l.last_time = l.run_start = now_seconds();
  l.step = sf_pipeline_step(l.p);
  l.epoch_seen = sf_pipeline_epoch(l.p);
  status = finish_run(&l, stats_path, summary, loop_run(&l, &options));
  sf_pipeline_destroy(&l.p);
  return status;
}

const sf_cli_command sf_cli_run = {
    .name = "run",
    .run = run_main,
    .args = "GRAPH [--set NODE.OPTION=VALUE]... [--epochs N]",
    .summary = "run a graph file, print rates",
    .about = "Runs GRAPH (a YAML graph file) and consumes its batches as a trainer would.",
    .options = run_options,
    .notes = "Rate= is an exponential moving average of samples/s (smoothing 0.4, as torch_xla's\n"
             "RateTracker); GlobalRate= is samples/s since the epoch began. With groups, Workers= is the\n"
             "number of live workers and each worker's samples/s follows its name.\n"
             "When stdout is a terminal (and not --quiet), a one-line progress bar redrawn in place replaces the\n"
             "Training lines: samples of the epoch (of samples_per_epoch, else of the last epoch's count), rate,\n"
             "ETA once the epoch length is known, epoch, step and the group's live workers.",
};
