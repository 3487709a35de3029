/* `shardflow dot GRAPH`: the graph's nodes and edges, branches included, in Graphviz's DOT language. */
#include <stdio.h>

#include "cli/cli.h"
#include "shardflow/shardflow.h"

static const sf_cli_option dot_options[] = {
    {.row = {NULL}},
};

/* Text inside a DOT string: quotes and backslashes escaped. */
static void put_escaped(const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') putchar('\\');
    putchar(*s);
  }
}

static void put_quoted(const char *s) {
  putchar('"');
  put_escaped(s);
  putchar('"');
}

static int dot_main(int argc, char **argv) {
  int first, status;
  if (!sf_cli_parse(&sf_cli_dot, argc, argv, NULL, &first, &status)) return status;
  if (argc - first != 1) return sf_cli_usage_error(&sf_cli_dot, "takes one GRAPH file (got %d operand(s))", argc - first);
  sf_graph *g = NULL;
  sf_error err;
  if (sf_graph_load_file(&g, argv[first], &err) < 0) {
    char line[1200];
    return sf_cli_fail(&sf_cli_dot, "%s", sf_error_format(&err, line, sizeof line));
  }
  printf("digraph ");
  put_quoted(argv[first]);
  printf(" {\n  rankdir=LR;\n  node [shape=box, fontname=\"Helvetica\"];\n");
  int n = sf_graph_node_count(g);
  for (int i = 0; i < n; i++) {
    printf("  ");
    put_quoted(sf_graph_node_name(g, i));
    printf(" [label=\"");
    put_escaped(sf_graph_node_name(g, i));
    printf("\\n(");
    put_escaped(sf_graph_node_type(g, i));
    printf(")\"];\n");
  }
  for (int i = 0; i < n; i++) {
    int ports = 0;
    while (ports < 8 && sf_graph_node_input(g, i, ports) >= 0) ports++;
    for (int p = 0; p < ports; p++) {
      printf("  ");
      put_quoted(sf_graph_node_name(g, sf_graph_node_input(g, i, p)));
      printf(" -> ");
      put_quoted(sf_graph_node_name(g, i));
      if (ports > 1) printf(" [label=\"in%d\"]", p);
      printf(";\n");
    }
  }
  printf("}\n");
  sf_graph_destroy(&g);
  return 0;
}

const sf_cli_command sf_cli_dot = {
    .name = "dot",
    .run = dot_main,
    .args = "GRAPH",
    .summary = "draw a graph file's stages and branches (Graphviz DOT on stdout)",
    .about = "Checks GRAPH like `shardflow run` would and prints its nodes (name and stage) and edges in\n"
             "Graphviz's DOT language; the inputs of a stage that merges branches (mix) are labelled in0, in1...\n"
             "in the order of its `inputs:`. Render it with e.g. `shardflow dot g.yaml | dot -Tsvg > g.svg`.",
    .options = dot_options,
};
