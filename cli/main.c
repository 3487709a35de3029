/* shardflow command-line entry point: dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "shardflow/shardflow.h"

const sf_cli_command sf_cli_commands[] = {
    {"run", sf_cli_run, "GRAPH [--set NODE.OPTION=VALUE]... [--epochs N]", "run a graph file, print rates"},
    {"ls", sf_cli_ls, "[--json] URL...", "list the samples of shards"},
    {"write", sf_cli_write, "[OPTIONS] INPUT OUTPUT_PATTERN", "create WebDataset shards"},
    {"cp", sf_cli_cp, "[--no-verify] SRC DST", "copy files to/from http(s) storage, atomically"},
    {"worker", sf_cli_worker, "--connect ENDPOINT [--key K --server-key K]", "join a head's group and run its stages"},
    {"keygen", sf_cli_keygen, "NAME [--dir DIR]", "CURVE key pair for a head or worker (NAME.key, NAME.pub)"},
    {"help", sf_cli_help, "[STAGE|COMMAND]", "stages and their options, or a command's usage"},
    {NULL},
};

const sf_cli_command *sf_cli_find_command(const char *name) {
  for (const sf_cli_command *c = sf_cli_commands; c->name; c++)
    if (strcmp(c->name, name) == 0) return c;
  return NULL;
}

static void usage(FILE *out) {
  fprintf(out, "usage: shardflow COMMAND [ARGS]\n\ncommands:\n");
  for (const sf_cli_command *c = sf_cli_commands; c->name; c++) {
    char head[80];
    snprintf(head, sizeof head, "%s %s", c->name, c->args);
    fprintf(out, "  %-52s %s\n", head, c->summary);
  }
  fprintf(out, "  %-52s %s\n\n`shardflow COMMAND --help` describes each command.\n", "version", "print the version");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  const sf_cli_command *c = sf_cli_find_command(cmd);
  if (c) return c->run(argc - 1, argv + 1);
  if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
    printf("shardflow %s\n", sf_version_string());
    return 0;
  }
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "shardflow: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return 2;
}
