/* shardflow command-line entry point: dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "shardflow/shardflow.h"

static void usage(FILE *out) {
  fprintf(out,
          "usage: shardflow COMMAND [ARGS]\n"
          "\n"
          "commands:\n"
          "  run GRAPH [--set NODE.OPTION=VALUE]... [--epochs N]   run a graph file, print rates\n"
          "  ls [--json] URL...                                   list the samples of shards\n"
          "  write [OPTIONS] INPUT OUTPUT_PATTERN                  create WebDataset shards\n"
          "  cp [--no-verify] SRC DST                             copy files to/from http(s) storage, atomically\n"
          "  worker --connect ENDPOINT [--key K --server-key K]   join a head's group and run its stages\n"
          "  keygen NAME [--dir DIR]                              CURVE key pair for a head or worker (NAME.key, NAME.pub)\n"
          "  help [STAGE]                                         stages and their options\n"
          "  version                                              print the version\n"
          "\n"
          "`shardflow COMMAND --help` describes each command.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "run") == 0) return sf_cli_run(argc - 1, argv + 1);
  if (strcmp(cmd, "ls") == 0) return sf_cli_ls(argc - 1, argv + 1);
  if (strcmp(cmd, "write") == 0) return sf_cli_write(argc - 1, argv + 1);
  if (strcmp(cmd, "cp") == 0) return sf_cli_cp(argc - 1, argv + 1);
  if (strcmp(cmd, "worker") == 0) return sf_cli_worker(argc - 1, argv + 1);
  if (strcmp(cmd, "keygen") == 0) return sf_cli_keygen(argc - 1, argv + 1);
  if (strcmp(cmd, "help") == 0) return sf_cli_help(argc - 1, argv + 1);
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
