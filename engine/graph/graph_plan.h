/*
 * The plan: what the engine decides between reading a graph and running it, so that a graph written
 * without tuning runs as a tuned one would. Replicas for map stages the graph file leaves unset, which
 * edges may carry deferred fields (a JPEG left undecoded for a cropping augment), and the form a group's
 * results travel in. A value the graph file writes is kept as written. `shardflow run --explain` prints the plan.
 */
#ifndef SF_ENGINE_GRAPH_PLAN_H
#define SF_ENGINE_GRAPH_PLAN_H

#include <stdio.h>

#include "graph.h"

/*
 * The bytes an edge that may carry deferred fields holds, counted at their materialised size (an undecoded
 * JPEG as its pixels), when queue_bytes does not say less: a handful of photographs rather than queue_size's
 * 64. Measured on the ImageNet-like graph of bench/imagenet.sh: 9% less CPU a sample and 7% less wall time
 * than with 64 in flight, and `queue_size: 4` did as well, because fewer images in flight keep the pixel
 * buffers they go through in the cache; CIFAR's small images never reach the cap.
 */
enum { SF_PLAN_DEFERRED_EDGE_BYTES = 4 << 20 };

/* The bytes the edge out of node n may hold in all its queues: queue_bytes (0: no cap), at most
   SF_PLAN_DEFERRED_EDGE_BYTES where the plan lets n's output carry deferred fields (may_defer). */
int64_t sf_graph_edge_bytes(const sf_graph *g, const sf_graph_node *n);

/*
 * Plans graph g, one process's graph (the head's with its groups split off, or a worker's), for a process
 * with `cpus` CPUs; a whole graph with its groups (`shardflow dot`) is planned as if each group's workers had
 * as many, and no deferred field crosses from one group (or the head) to another. links: sf_graph_resolve_links' defs and inputs for g. Map stages (SF_STAGE_MAP) whose
 * `replicas` nothing wrote and that merge no inputs get `cpus` replicas, or the count of a neighbour whose
 * replicas are written where that differs (adjacent replicated nodes must agree); a node whose stage makes
 * deferred fields (SF_STAGE_MAKES_DEFERRED) may, when its one consumer takes them (SF_STAGE_TAKES_DEFERRED).
 * Such a node's output edge holds at most SF_PLAN_DEFERRED_EDGE_BYTES (sf_graph_edge_bytes).
 * Sets replicas, replicas_planned and may_defer on g's nodes. Never fails; planning again gives the same.
 */
void sf_graph_plan(sf_graph *g, const sf_stage_def **defs, const int *inputs, int cpus);

/* What a group's results travel to the head as (sf_graph_node.wire_plan of its group's head node or `groups:` entry). */
enum sf_wire_plan {
  SF_WIRE_AS_MADE = 0,   /* as the group's last stage makes them: it is not an augment (or its options do not parse) */
  SF_WIRE_UINT8,         /* planned: uint8 HWC crops, normalised on the head by an augment the plan added */
  SF_WIRE_PINNED,        /* the group's `wire_form: as_written` keeps the augment's float output */
  SF_WIRE_WRITTEN_UINT8, /* the group's augment already makes uint8 (written so) */
  SF_WIRE_INTO_GROUP,    /* the results go on to another group's workers, not to a stage of the head */
};

/*
 * The form a group's results travel in (group option `wire_form`, default auto). Where a group's last stage is
 * an augment whose output is float32 or bfloat16 and its results go to a stage of the head (not on to another
 * group), the group's augment makes uint8 HWC crops instead (same crop, resize and flip; no mean/std) and a new
 * augment "<name>_normalize" on the head right after the group applies the normalisation, layout and dtype (no
 * crop, no flip): the same batches bit for bit (augment resamples to uint8 before it normalises) with 4x
 * (float32) or 2x (bfloat16) fewer bytes on the wire. For every group, local processes included: the head writes
 * each float into the batch either way (out of the ring, or normalising), so the workers' writing 4x the bytes
 * is extra work (bench/groups.sh, docs/groups.md). An augment already written as uint8, or `wire_form:
 * as_written`, is kept. g: a head's graph (sf_graph_split_groups: the group's head nodes' stages are
 * rewritten, which its workers receive) or a whole graph with `groups:` (`shardflow dot`). Sets wire_plan on
 * each group's group's head node or `groups:` entry and wire_normalize on each node added. A graph that does not
 * link is left as written. Returns 0 or SF_ENOMEM (error filled; g may be partly planned: destroy it).
 */
int sf_graph_plan_groups(sf_graph *g, sf_error *error);

/*
 * Writes the plan of g (after sf_graph_plan) to out for `run --explain`: a node a line in chain order
 * (order: sf_graph_resolve_links') with its replicas and why, then each edge with the form its fields
 * travel in and why. A group's stages are planned as a worker of `cpus` CPUs would plan them.
 */
void sf_graph_plan_explain(FILE *out, const sf_graph *g, const sf_stage_def **defs, const int *inputs,
                           const int *order, int cpus);

/*
 * `shardflow run --explain`: plans graph as sf_pipeline_new would in this process (its groups split off,
 * this process's CPU budget) and writes the plan to out. Returns 0, or the error sf_pipeline_new would
 * give for the graph's links (a bad graph), naming the file and line.
 */
int sf_graph_explain(const sf_graph *graph, FILE *out, sf_error *error);

#endif
