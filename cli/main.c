/* shardflow command-line entry point: dispatches to the subcommands. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "shardflow/shardflow.h"

/* Each command's definition lives with its code (cli/NAME.c); this order is the usage list's. */
const sf_cli_command *const sf_cli_commands[] = {
    &sf_cli_run, &sf_cli_ls, &sf_cli_write, &sf_cli_cp, &sf_cli_worker, &sf_cli_keygen, &sf_cli_dot, &sf_cli_help, NULL,
};

const sf_cli_command *sf_cli_find_command(const char *name) {
  for (const sf_cli_command *const *c = sf_cli_commands; *c; c++)
    if (strcmp((*c)->name, name) == 0) return *c;
  return NULL;
}

static void usage(FILE *out) {
  fprintf(out, "usage: shardflow COMMAND [ARGS]\n\ncommands:\n");
  for (const sf_cli_command *const *c = sf_cli_commands; *c; c++) {
    char head[80];
    snprintf(head, sizeof head, "%s %s", (*c)->name, (*c)->args);
    fprintf(out, "  %-52s %s\n", head, (*c)->summary);
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
