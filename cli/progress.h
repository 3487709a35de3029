/* `shardflow run`'s live reports: the one-line progress bar on a TTY and --stats-json's JSON lines (cli/progress.c). */
#ifndef SF_CLI_PROGRESS_H
#define SF_CLI_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "shardflow/shardflow.h"

/* Where a run stands, as cli/run.c counts it (samples are those the trainer took). */
typedef struct sf_cli_progress {
  uint64_t epoch;          /* the epoch running, 1-based as the log lines print it */
  uint64_t step;           /* batches taken in this epoch */
  uint64_t samples;        /* samples taken in this epoch */
  uint64_t total_samples;  /* samples taken since the run began */
  uint64_t epoch_length;   /* samples an epoch has (samples_per_epoch, else the last epoch's count); 0 = unknown */
  double rate;             /* samples/s, the moving average of the Rate= log lines */
  double epoch_seconds;    /* seconds since this epoch began */
  double run_seconds;      /* seconds since the run began */
} sf_cli_progress;

/*
 * The samples one epoch of graph yields on this rank when the graph says so: the
 * `samples_per_epoch` of a mix, else of a shard_source (per rank, docs/stages.md).
 * Returns 0 when no node sets it (the length is then known only after an epoch).
 */
uint64_t sf_cli_epoch_length(const sf_graph *graph);

/*
 * Redraws the progress bar on out (a terminal): carriage return, then one line of
 * samples (of the epoch length, with a bar), rate, ETA when the length is known,
 * epoch, step and the group's live workers (when p has a group), then "erase to the
 * end of line".  No newline: the next call overwrites it.
 */
void sf_cli_progress_bar(FILE *out, sf_pipeline *p, const sf_cli_progress *pr);

/*
 * Appends one JSON record (one line, format in docs/stats-json.md) to out:
 * pr's counts, every head node's sf_pipeline_stats with mean rates over the run, the
 * group's workers and their stage tables, and the sf_pipeline_bottleneck line; final
 * marks the record written after the run ended.  Flushes out.  Returns 0, or -1 when
 * writing failed (errno set) or memory ran out.
 */
int sf_cli_stats_record(FILE *out, sf_pipeline *p, const sf_cli_progress *pr, bool final);

#endif
