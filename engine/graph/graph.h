/* The intermediate form of a graph: nodes, options as text with source lines, edges, settings. */
#ifndef SF_ENGINE_GRAPH_H
#define SF_ENGINE_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "shardflow/shardflow.h"
#include "shardflow/stage.h"

typedef struct sf_graph_value {
  char *key;
  char *value;   /* text, parsed later by the option's own parser */
  int64_t line;  /* 1-based line in the graph file, or -1 (set by --set / API) */
} sf_graph_value;

typedef struct sf_graph_node {
  char *name;
  char *type;
  int64_t line;
  int64_t replicas;
  int64_t replicas_line; /* the line that writes `replicas`, 0 when --set or the API did, -1 when nothing did */
  bool replicas_planned; /* sf_graph_plan chose replicas (nothing wrote them) */
  bool may_defer;        /* sf_graph_plan lets the node's output carry deferred fields (sf_node_may_defer) */
  /* sf_graph_plan_groups: on a group's group's head node (or its `groups:` entry) the form its results travel in
   * (sf_wire_plan, engine/graph/graph_plan.h); true on the augment it added on the head to normalise them. */
  int wire_plan;
  bool wire_normalize;
  sf_graph_value *values;
  int n_values;
  char *group;          /* the group the node runs in (`group:`), or NULL for the head process */
  int64_t group_line;
  /* A group's head node made by sf_graph_split_groups: the group's stages (owned), which its workers run. */
  sf_graph *group_stages;
  /* `inputs:` (or `input:`): names of earlier nodes feeding the input ports in order, ", "-joined; NULL =
   * the previous node in the file (a source takes none). */
  char *inputs;
  int64_t inputs_line;
  void *attachment;     /* sf_graph_attach's object for the node's stage (borrowed), or NULL */
} sf_graph_node;

/* Most input ports a node may have connected (a mix of that many sources). */
enum { SF_GRAPH_MAX_INPUTS = SF_NODE_INPUTS_MAX };

typedef struct sf_graph_edge {
  char *from, *to;
  int64_t line;
} sf_graph_edge;

/* One entry of the graph file's `plugins:` list: a plugin name or a .so path, and its line. */
typedef struct sf_graph_plugin {
  char *name;
  int64_t line;
  char *build_id; /* the build the head loaded, in a group's stages sent to workers (sf_graph_split_groups); else NULL */
} sf_graph_plugin;

enum { SF_POLICY_SKIP = 0, SF_POLICY_FAIL = 1 };

struct sf_graph {
  char *path;              /* file name for messages */
  uint64_t seed;
  int64_t epochs;          /* 0 = until stopped */
  int error_policy;        /* SF_POLICY_* */
  int64_t queue_size;      /* items per sample edge */
  int64_t queue_bytes;     /* tensor bytes per queue (sample and batch edges); 0 = items only */
  int64_t threads;         /* pool workers; 0 = online CPUs */
  int64_t max_errors;      /* error records before the run stops; 0 = no limit */
  double max_error_rate;   /* skipped / read samples above which the run stops; 1 = never */
  char metrics[256];       /* `metrics: HOST:PORT` or PORT (127.0.0.1): serve /metrics there (engine/exec/metrics.c); "" = off */
  sf_graph_node *nodes;
  int n_nodes;
  /* `edges:` as written (retired: sf_graph_resolve refuses a graph that has it, with the chain it makes), and
   * the line of its key. */
  sf_graph_edge *edges;
  int n_edges;
  int64_t edges_line;
  /* `groups:` entries: name, line and options as text (type is "group"); parsed by the
   * group head stage's options table when the head's pipeline is built (engine/graph/graph_groups.c). */
  sf_graph_node *groups;
  int n_groups;
  /* `plugins:` entries in file order, loaded by sf_graph_load_plugins() before stage types are resolved. */
  sf_graph_plugin *plugins;
  int n_plugins;
};

/* An empty graph named path. NULL when out of memory. */
sf_graph *sf_graph_new_empty(const char *path);

/* Adds a node (copies strings). Returns the node or NULL when out of memory. */
sf_graph_node *sf_graph_add_node(sf_graph *graph, const char *name, const char *type, int64_t line);

/* Adds a group (copies the name). Returns the group or NULL when out of memory. */
sf_graph_node *sf_graph_add_group(sf_graph *graph, const char *name, int64_t line);
/* Adds a `plugins:` entry (copies name). Returns 0 or SF_ENOMEM. */
int sf_graph_add_plugin(sf_graph *graph, const char *name, int64_t line);
/*
 * Loads the graph's `plugins:` entries in order (engine/graph/plugin_loader.h).
 * Returns 0, or the loader's error code with a message that starts with the
 * graph file and the entry's line, then names the plugin's file and what to do.
 */
int sf_graph_load_plugins(const sf_graph *graph, sf_error *error);

/* Finds a group by name, or NULL. */
sf_graph_node *sf_graph_find_group(const sf_graph *graph, const char *name);
/* Puts node into group (copies the name). Returns 0 or SF_ENOMEM. */
int sf_graph_node_set_group(sf_graph_node *node, const char *group, int64_t line);
/* Sets (or replaces) node option key. Returns 0 or SF_ENOMEM. */
int sf_graph_node_set(sf_graph_node *node, const char *key, const char *value, int64_t line);
/* The value node writes for key (graph file, --set or API), or NULL when it writes none. Borrowed from node. */
const sf_graph_value *sf_graph_node_value(const sf_graph_node *node, const char *key);

/* Adds an edge. Returns 0 or SF_ENOMEM. */
int sf_graph_add_edge(sf_graph *graph, const char *from, const char *to, int64_t line);

/* Finds a node by name, or NULL. */
sf_graph_node *sf_graph_find_node(const sf_graph *graph, const char *name);

/*
 * The dataset size of shard_source node i of graph (its expanded urls, each shard's index as order: global
 * loads it): *samples. Returns 0, or the shard list's or an index's error with *error (not NULL) naming it.
 */
int sf_graph_source_size(const sf_graph *graph, int node, uint64_t *samples, sf_error *error);

/* The seed sf_node_seed() gives a node called name in a graph of seed: seed mixed with the name's FNV-1a hash. */
uint64_t sf_graph_node_seed(uint64_t seed, const char *name);

/* Deep copy. NULL when out of memory. */
sf_graph *sf_graph_copy(const sf_graph *graph);

/* Appends a copy of node (name, type, lines, replicas, group, options, group stages) to graph. Returns it, or NULL (out of memory). */
sf_graph_node *sf_graph_copy_node(sf_graph *graph, const sf_graph_node *node);

/* Applies the graph setting key (seed, epochs, error_policy, queue_size). */
int sf_graph_set_setting(sf_graph *graph, const char *key, const char *value, int64_t line,
                         sf_error *error);

/*
 * Resolves stage definitions and the execution order (edges, or file order),
 * checking port kinds and replicas. On success order[k] is the graph index of
 * the k-th node of the chain (source first) and defs[i] the definition of
 * graph node i; both arrays have n_nodes entries and are owned by the caller
 * (free()).
 */
int sf_graph_resolve(const sf_graph *graph, int **order, const sf_stage_def ***defs, sf_error *error);

/*
 * sf_graph_resolve, and the links: (*inputs)[i * SF_GRAPH_MAX_INPUTS + p] is the graph index of the node
 * feeding input port p of graph node i, or -1 past its last connected port.  A chain links each node to the
 * one before it; `inputs:` names the feeding nodes (fan-in).  Every node but the last feeds exactly one
 * node.  *inputs has n_nodes * SF_GRAPH_MAX_INPUTS entries, owned by the caller (free()).
 */
int sf_graph_resolve_links(const sf_graph *graph, int **order, const sf_stage_def ***defs, int **inputs,
                           sf_error *error);
/* True when some node of graph names its `inputs:` (the graph has branches). */
bool sf_graph_has_branches(const sf_graph *graph);

/*
 * Allocates def->priv_size zeroed bytes, applies defaults then the node's
 * values. On failure the error names the graph file, line and valid names;
 * *priv is freed and NULL.
 */
int sf_graph_node_apply(const sf_graph *graph, const sf_graph_node *node, const sf_stage_def *def,
                        void **priv, sf_error *error);

/*
 * The graph settings (top-level keys of a graph file besides stages, edges, groups and plugins), rows
 * into sf_graph: they parse the file and `--set KEY=VALUE`, give sf_graph_new_empty its defaults and print
 * `shardflow help settings` and docs/stages.md.  The metrics row is for help only: the setting is stored
 * by sf_graph_set_setting itself (a fixed array).
 */
extern const sf_option sf_graph_settings[];

/*
 * The checks of sf_graph_validate before the groups' (engine/graph/graph_groups.c, which calls this):
 * the links resolve and every node's options apply.  Returns 0 or the error, with the graph file and line.
 */
int sf_graph_check_nodes(const sf_graph *graph, sf_error *error);
/* Fills an error record (graph path, line, message). Returns code. */
int sf_graph_error(sf_error *error, int code, const sf_graph *graph, int64_t line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
