/* `shardflow dot GRAPH`: the graph's nodes, edges and groups in Graphviz's DOT language, with rates from a
 * --stats-json record, rendered by Graphviz's `dot` program on request. */
#include <errno.h>
#include <jansson.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cpu_budget.h"
#include "graph.h"
#include "graph_plan.h"
#include "shardflow/shardflow.h"

extern char **environ;

typedef struct dot_args {
  char *stats, *output;
  int render; /* index into render_names, or -1: print the DOT text */
} dot_args;

static const char *const render_names[] = {"svg", "png", NULL};

static const sf_cli_option dot_options[] = {
    {.row = {"stats", SF_OPT_STRING, offsetof(dot_args, stats),
             .help = "label edges with rates (items/s, MiB/s), nodes with busy share and replicas, and mark the "
                     "bottleneck, from the last record of FILE, written by `shardflow run --stats-json FILE`"},
     .value = "FILE"},
    {.row = {"render", SF_OPT_ENUM, offsetof(dot_args, render),
             .help = "render with Graphviz's `dot` program (Debian: graphviz) instead of printing DOT text",
             .enum_names = render_names},
     .value = "FORMAT",
     .short_name = 'T'},
    {.row = {"output", SF_OPT_STRING, offsetof(dot_args, output), .help = "write to FILE instead of stdout"},
     .value = "FILE",
     .short_name = 'o'},
    {.row = {NULL}},
};

/* Text inside a DOT string: quotes and backslashes escaped. */
static void put_escaped(FILE *out, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', out);
    fputc(*s, out);
  }
}

static void put_quoted(FILE *out, const char *s) {
  fputc('"', out);
  put_escaped(out, s);
  fputc('"', out);
}

/* The last non-empty line of path parsed as JSON (a --stats-json record), or NULL after printing why. */
static json_t *load_stats(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    sf_cli_fail(&sf_cli_dot, "--stats %s: %s; give the file `shardflow run --stats-json FILE` wrote", path,
                strerror(errno));
    return NULL;
  }
  char *line = NULL, *last = NULL;
  size_t cap = 0;
  long number = 0, last_number = 0;
  while (getline(&line, &cap, f) >= 0) {
    number++;
    if (strspn(line, " \t\r\n") == strlen(line)) continue;
    free(last);
    last = strdup(line);
    last_number = number;
  }
  free(line);
  fclose(f);
  json_error_t why;
  json_t *record = last ? json_loads(last, 0, &why) : NULL;
  free(last);
  if (!last_number)
    sf_cli_fail(&sf_cli_dot, "--stats %s: the file is empty; `shardflow run --stats-json FILE` writes a record every "
                "--log-steps batches and one at the end", path);
  else if (!record || !json_is_array(json_object_get(record, "nodes")))
    sf_cli_fail(&sf_cli_dot, "--stats %s:%ld: not a stats record (%s); give the file `shardflow run --stats-json "
                "FILE` wrote", path, last_number, record ? "no \"nodes\" list" : why.text);
  else
    return record;
  json_decref(record);
  return NULL;
}

/* The node's mean rates in the record: a head node's, else the sum over the group's workers of their stage of that
 * name. Returns false when the record does not name it. */
static bool node_rates(json_t *record, const char *name, double *items, double *mib) {
  size_t i, j, k;
  json_t *n, *group, *worker, *stage;
  *items = *mib = 0;
  json_array_foreach(json_object_get(record, "nodes"), i, n) {
    if (strcmp(json_string_value(json_object_get(n, "name")) ?: "", name) != 0) continue;
    *items = json_number_value(json_object_get(n, "items_per_second"));
    *mib = json_number_value(json_object_get(n, "mib_per_second"));
    return true;
  }
  bool found = false;
  json_array_foreach(json_object_get(record, "groups"), i, group) {
    json_array_foreach(json_object_get(group, "workers"), j, worker) {
      json_array_foreach(json_object_get(worker, "stages"), k, stage) {
        if (strcmp(json_string_value(json_object_get(stage, "name")) ?: "", name) != 0) continue;
        *items += json_number_value(json_object_get(stage, "items_per_second"));
        *mib += json_number_value(json_object_get(stage, "mib_per_second"));
        found = true;
      }
    }
  }
  return found;
}

/* The node's busy share in the record: a head node's busy seconds over (elapsed x its replicas), as the bottleneck
 * report judges it; a group's stage summed over the workers that report it, over (elapsed x replicas x workers).
 * Sets *replicas (the head node's, else the graph's) and *workers (0 for a head node). Returns false when the record
 * does not name the node. */
static bool node_busy(json_t *record, const sf_graph_node *gn, double *share, int *replicas, int *workers) {
  double elapsed = json_number_value(json_object_get(record, "elapsed_seconds"));
  size_t i, j, k;
  json_t *n, *group, *worker, *stage;
  *workers = 0;
  json_array_foreach(json_object_get(record, "nodes"), i, n) {
    if (strcmp(json_string_value(json_object_get(n, "name")) ?: "", gn->name) != 0) continue;
    *replicas = (int)json_integer_value(json_object_get(n, "replicas"));
    if (*replicas < 1) *replicas = 1;
    *share = elapsed > 0 ? json_number_value(json_object_get(n, "busy_seconds")) / (elapsed * *replicas) : 0;
    return true;
  }
  double busy = 0;
  json_array_foreach(json_object_get(record, "groups"), i, group) {
    json_array_foreach(json_object_get(group, "workers"), j, worker) {
      json_array_foreach(json_object_get(worker, "stages"), k, stage) {
        if (strcmp(json_string_value(json_object_get(stage, "name")) ?: "", gn->name) != 0) continue;
        busy += json_number_value(json_object_get(stage, "busy_seconds"));
        (*workers)++;
      }
    }
  }
  *replicas = gn->replicas > 0 ? (int)gn->replicas : 1;
  *share = elapsed > 0 && *workers ? busy / (elapsed * *replicas * *workers) : 0;
  return *workers > 0;
}

/* The node the record's bottleneck line names (the `bottleneck_node` key), or NULL. */
static const char *bottleneck_node(json_t *record) {
  return json_string_value(json_object_get(record, "bottleneck_node")); /* NULL record, key or null: NULL */
}

/* A node: its name and stage and, with stats, its busy share and replicas; the bottleneck drawn red. */
static void put_node(FILE *out, const sf_graph *g, int i, const char *indent, json_t *record) {
  fprintf(out, "%s", indent);
  put_quoted(out, sf_graph_node_name(g, i));
  fprintf(out, " [label=\"");
  put_escaped(out, sf_graph_node_name(g, i));
  fprintf(out, "\\n(");
  put_escaped(out, sf_graph_node_type(g, i));
  fprintf(out, ")");
  double share;
  int replicas, workers;
  if (record && node_busy(record, &g->nodes[i], &share, &replicas, &workers)) {
    fprintf(out, "\\nbusy %.0f%% of %d replica(s)", share * 100, replicas);
    if (workers) fprintf(out, " x %d worker(s)", workers);
  } else if (g->nodes[i].replicas > 1 || g->nodes[i].replicas_planned) { /* the plan's, without stats */
    fprintf(out, "\\nreplicas %lld%s", (long long)g->nodes[i].replicas, g->nodes[i].replicas_planned ? " (planned)" : "");
  }
  if (g->nodes[i].wire_normalize) fprintf(out, "\\nplanned: normalises the group's crops");
  const char *culprit = bottleneck_node(record);
  bool marked = culprit && strcmp(culprit, sf_graph_node_name(g, i)) == 0;
  fprintf(out, "%s\"%s];\n", marked ? "\\nbottleneck" : "", marked ? ", color=\"red\", penwidth=3" : "");
}

/* A group as a cluster: its stages inside, labelled with its name, how its workers start and, with stats, how many
 * are live. */
static void put_group(FILE *out, const sf_graph *g, const sf_graph_node *group, json_t *record) {
  fprintf(out, "  subgraph ");
  fputc('"', out);
  fputs("cluster_", out);
  put_escaped(out, group->name);
  fprintf(out, "\" {\n    style=rounded;\n    label=\"group ");
  put_escaped(out, group->name);
  for (int v = 0; v < group->n_values; v++)
    if (strcmp(group->values[v].key, "processes") == 0 || strcmp(group->values[v].key, "listen") == 0) {
      fprintf(out, "\\n%s: ", group->values[v].key);
      put_escaped(out, group->values[v].value);
    }
  size_t i;
  json_t *rg;
  json_array_foreach(json_object_get(record, "groups"), i, rg) /* record NULL: no stats, no loop */
    if (strcmp(json_string_value(json_object_get(rg, "name")) ?: "", group->name) == 0)
      fprintf(out, "\\nlive workers: %lld", (long long)json_integer_value(json_object_get(rg, "live_workers")));
  const char *culprit = bottleneck_node(record); /* the group's head-side node is named after the group */
  if (culprit && strcmp(culprit, group->name) == 0)
    fprintf(out, "\\nbottleneck\";\n    color=\"red\";\n    penwidth=3");
  else
    fputc('"', out);
  fprintf(out, ";\n");
  for (int n = 0; n < g->n_nodes; n++)
    if (g->nodes[n].group && strcmp(g->nodes[n].group, group->name) == 0) put_node(out, g, n, "    ", record);
  fprintf(out, "  }\n");
}

static void put_graph(FILE *out, const sf_graph *g, const char *path, json_t *record) {
  fprintf(out, "digraph ");
  put_quoted(out, path);
  fprintf(out, " {\n  rankdir=LR;\n  node [shape=box, fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\", "
          "fontsize=10];\n");
  int n = sf_graph_node_count(g);
  for (int i = 0; i < n; i++)
    if (!g->nodes[i].group) put_node(out, g, i, "  ", record);
  for (int k = 0; k < g->n_groups; k++) put_group(out, g, &g->groups[k], record);
  for (int i = 0; i < n; i++) {
    int ports = 0;
    while (ports < SF_GRAPH_MAX_INPUTS && sf_graph_node_input(g, i, ports) >= 0) ports++;
    for (int p = 0; p < ports; p++) {
      const char *from = sf_graph_node_name(g, sf_graph_node_input(g, i, p));
      fprintf(out, "  ");
      put_quoted(out, from);
      fprintf(out, " -> ");
      put_quoted(out, sf_graph_node_name(g, i));
      double items = 0, mib = 0;
      bool rated = record && node_rates(record, from, &items, &mib);
      bool deferred = g->nodes[sf_graph_node_input(g, i, p)].may_defer; /* the plan's field form on this edge */
      bool crops = g->nodes[i].wire_normalize;                           /* a group's results, sent as uint8 */
      if (ports > 1 || rated || deferred || crops) { /* a merge's port, what the producer sends (its mean over the run) */
        fprintf(out, " [label=\"");
        if (ports > 1) { /* the port's name in the stage's list (mix: in0, in1, ...) */
          const sf_stage_def *def = sf_stage_find(sf_graph_node_type(g, i));
          char port[64] = "";
          if (!def || sf_port_name_at(def->inputs, p, port, sizeof port) <= 0) snprintf(port, sizeof port, "in%d", p);
          put_escaped(out, port);
          fprintf(out, "%s", rated || deferred || crops ? "\\n" : "");
        }
        if (deferred) fprintf(out, "deferred fields%s", rated ? "\\n" : "");
        if (crops) fprintf(out, "uint8 HWC crops (planned)%s", rated ? "\\n" : "");
        if (rated) fprintf(out, "%.1f items/s\\n%.2f MiB/s", items, mib);
        fprintf(out, "\"]");
      }
      fprintf(out, ";\n");
    }
  }
  const char *line = json_string_value(json_object_get(record, "bottleneck"));
  if (line) { /* the report's whole line under the drawing: it also says when no node is to blame */
    fprintf(out, "  labelloc=b;\n  label=");
    put_quoted(out, line);
    fprintf(out, ";\n");
  }
  fprintf(out, "}\n");
}

/* Pipes text into `dot -TFORMAT [-o OUT]`. Returns the command's exit status (1 after printing why it failed). */
static int render(const char *text, size_t len, const char *format, const char *output) {
  char type[16];
  snprintf(type, sizeof type, "-T%s", format);
  char *argv[] = {"dot", type, output ? "-o" : NULL, (char *)output, NULL};
  int fds[2];
  if (pipe(fds) < 0) return sf_cli_fail(&sf_cli_dot, "pipe: %s", strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[0], STDIN_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  pid_t pid;
  int e = posix_spawnp(&pid, "dot", &actions, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[0]);
  if (e) {
    close(fds[1]);
    if (e == ENOENT)
      return sf_cli_fail(&sf_cli_dot, "-T %s needs Graphviz's `dot` program, which is not on PATH; install Graphviz "
                         "(Debian: apt-get install graphviz), or leave out -T to print the DOT text", format);
    return sf_cli_fail(&sf_cli_dot, "cannot start Graphviz's `dot`: %s", strerror(e));
  }
  bool written = true;
  for (size_t off = 0; off < len && written;) {
    ssize_t w = write(fds[1], text + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    written = w > 0;
    off += w > 0 ? (size_t)w : 0;
  }
  close(fds[1]);
  int status;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !written)
    return sf_cli_fail(&sf_cli_dot, "Graphviz's `dot -T%s` failed (see its message above)", format);
  return 0;
}

/* The plan drawn: planned replicas on nodes, edges that may carry deferred fields (a JPEG left undecoded), the augment
 * it adds on the head where a group sends uint8 HWC crops (the edge into it says so). A graph whose links do not resolve
 * is drawn as written (a run would say why). */
static void plan(sf_graph *g) {
  int *order = NULL, *inputs = NULL;
  const sf_stage_def **defs = NULL;
  sf_error e;
  if (g->n_groups > 0 && sf_graph_plan_groups(g, &e) < 0) return; /* out of memory: drawn as far as planned */
  if (sf_graph_resolve_links(g, &order, &defs, &inputs, &e) == 0) sf_graph_plan(g, defs, inputs, sf_cpu_budget_get().cpus);
  free(order);
  free(defs);
  free(inputs);
}

static int dot_main(int argc, char **argv) {
  dot_args a = {.render = -1};
  int first, status;
  if (!sf_cli_parse(&sf_cli_dot, argc, argv, &a, &first, &status)) return status;
  if (argc - first != 1)
    return sf_cli_usage_error(&sf_cli_dot, "takes one GRAPH file (got %d operand(s))", argc - first);
  sf_graph *g = NULL;
  sf_error err;
  if (sf_graph_load_file(&g, argv[first], &err) < 0) {
    char line[1200];
    return sf_cli_fail(&sf_cli_dot, "%s", sf_error_format(&err, line, sizeof line));
  }
  plan(g);
  json_t *record = NULL;
  if (a.stats && !(record = load_stats(a.stats))) {
    sf_graph_destroy(&g);
    return 1;
  }
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  if (!out) status = sf_cli_fail(&sf_cli_dot, "out of memory");
  if (out) {
    put_graph(out, g, argv[first], record);
    fclose(out);
    if (a.render >= 0) {
      status = render(text, len, render_names[a.render], a.output);
    } else {
      FILE *f = a.output ? fopen(a.output, "w") : stdout;
      if (!f || fwrite(text, 1, len, f) != len || (f != stdout && fclose(f) != 0))
        status = sf_cli_fail(&sf_cli_dot, "-o %s: %s", a.output ? a.output : "-", strerror(errno));
    }
  }
  free(text);
  json_decref(record);
  sf_graph_destroy(&g);
  return status;
}

const sf_cli_command sf_cli_dot = {
    .name = "dot",
    .run = dot_main,
    .args = "GRAPH [--stats FILE] [-T svg|png] [-o OUT]",
    .summary = "draw a graph file's stages, branches and groups (Graphviz DOT, or SVG/PNG through Graphviz)",
    .about = "Checks GRAPH like `shardflow run` would and prints its nodes (name and stage) and edges in\n"
             "Graphviz's DOT language; the inputs of a stage that merges branches (mix) are labelled in0, in1...\n"
             "in the order of its `inputs:`. Each group is a cluster (`subgraph cluster_NAME`) holding its stages,\n"
             "labelled with its name and its `processes` / `listen`. With --stats, every edge is labelled with\n"
             "what its producer sent (mean items/s and MiB/s over the run, from the last record), each node with\n"
             "its busy share (busy seconds over elapsed x replicas, and x workers in a group) and replicas, each\n"
             "group with its live workers, and the node or group the bottleneck report names is drawn red with\n"
             "\"bottleneck\" in its label (the report's line stands under the graph). The plan is drawn too: planned\n"
             "replicas, edges that may carry deferred fields, and the augment it adds on the head where a group sends\n"
             "uint8 HWC crops (the edge into it says so). -T svg|png renders with\n"
             "Graphviz's `dot` (e.g. `shardflow dot g.yaml -T svg -o g.svg`), the same as\n"
             "`shardflow dot g.yaml | dot -Tsvg > g.svg`.",
    .options = dot_options,
};
