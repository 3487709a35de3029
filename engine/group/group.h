/*
 * The group layer's stages, which the engine places itself (never written in a graph file; names start with
 * '_'): a group's head, the node that replaces the group's stages in the head's graph (engine/group/head.c),
 * and the two ends of the group's chain in a worker's pipeline (engine/group/worker.c).  The built-in stages'
 * table (stages/registry.c) lists them; the graph layer finds the head by SF_GROUP_HEAD_STAGE (registry.h).
 * What a head knows of its workers reaches the front ends through its stats callback (sf_stage_stats,
 * sf_worker_stats; sf_pipeline_stats and sf_pipeline_workers), not through this header.
 */
#ifndef SF_ENGINE_GROUP_H
#define SF_ENGINE_GROUP_H

#include "shardflow/stage.h"

extern const sf_stage_def sf_stage_group_head;
extern const sf_stage_def sf_stage_worker_source;
extern const sf_stage_def sf_stage_worker_sink;

#endif
