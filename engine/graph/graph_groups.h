/*
 * Groups: runs of map stages placed outside the head process (`groups:` and
 * `group:` in a graph file).  The head's pipeline replaces each run by one
 * group's head node (engine/group/head.c) that hands work units to worker processes;
 * a worker runs the run's stages between a _worker_source and a _worker_sink
 * (engine/group/worker.c).
 */
#ifndef SF_ENGINE_GROUP_H
#define SF_ENGINE_GROUP_H

#include "graph.h"

/*
 * Builds the head's graph: graph in chain order with every group's run of
 * nodes replaced by one node named after the group, of type _group (the group's head), whose
 * options are the group's options and whose group_stages are the run's nodes
 * (the graph's intermediate form, sent to workers in WELCOME as it is).
 * Returns 0 and a new graph in *head (the caller destroys it), or an error
 * naming the graph file and line.
 */
int sf_graph_split_groups(const sf_graph *graph, sf_graph **head, sf_error *error);

/*
 * Builds the graph a worker runs from the group's stages the head sent and its
 * settings: _worker_source, the stages, _worker_sink.  Errors name the head's
 * graph file and the stages' lines there.  Returns 0 or the graph error.
 */
int sf_group_worker_graph(sf_graph **graph, const sf_graph *stages, uint64_t seed, int error_policy,
                          int64_t threads, sf_error *error);

#endif
