/*
 * The plan: what the engine decides between reading a graph and running it, so that a graph written
 * without tuning runs as a tuned one would. Replicas for map stages the graph file leaves unset, and which
 * edges may carry deferred fields (a JPEG left undecoded for a cropping augment). A value the graph file
 * writes is kept as written. `shardflow run --explain` prints the plan.
 */
#ifndef SF_ENGINE_GRAPH_PLAN_H
#define SF_ENGINE_GRAPH_PLAN_H

#include <stdio.h>

#include "graph.h"

/*
 * Plans graph g, one process's graph (the head's with its groups split off, or a worker's), for a process
 * with `cpus` CPUs; a whole graph with its groups (`shardflow dot`) is planned as if each group's workers had
 * as many, and no deferred field crosses from one group (or the head) to another. links: sf_graph_resolve_links' defs and inputs for g. Map stages (SF_STAGE_MAP) whose
 * `replicas` nothing wrote and that merge no inputs get `cpus` replicas, or the count of a neighbour whose
 * replicas are written where that differs (adjacent replicated nodes must agree); a node whose stage makes
 * deferred fields (SF_STAGE_MAKES_DEFERRED) may, when its one consumer takes them (SF_STAGE_TAKES_DEFERRED).
 * Sets replicas, replicas_planned and may_defer on g's nodes. Never fails; planning again gives the same.
 */
void sf_graph_plan(sf_graph *g, const sf_stage_def **defs, const int *inputs, int cpus);

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
