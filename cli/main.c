/* shardflow command-line entry point: dispatches to the subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef SF_MIMALLOC
#include <mimalloc.h>
#endif

#include "cli/cli.h"
#include "shardflow/shardflow.h"

/* Each command's definition lives with its code (cli/NAME.c); this order is the usage list's. */
const sf_cli_command *const sf_cli_commands[] = {
    &sf_cli_run, &sf_cli_ls, &sf_cli_index, &sf_cli_write, &sf_cli_cp, &sf_cli_worker, &sf_cli_keygen, &sf_cli_dot, &sf_cli_help,
    &sf_cli_config, NULL,
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

/*
 * mimalloc hands an emptied span's pages back to the kernel 25 ms after it empties (MADV_DONTNEED).
 * A group's processes free and refill images and messages of hundreds of KB faster than that, so each
 * refill page-faults and the kernel zeroes the pages again (bench/groups.sh (b): 1.1 of 12 CPU-s in
 * the kernel, 0.6 with a second's delay; wall time -5%). A second keeps a steady run's memory mapped
 * and still returns what a shrinking or idle run frees. MIMALLOC_DECOMMIT_DELAY (ms) overrides it.
 */
static void tune_allocator(void) {
#ifdef SF_MIMALLOC
  if (!getenv("MIMALLOC_DECOMMIT_DELAY")) mi_option_set(mi_option_decommit_delay, 1000);
#endif
}

int main(int argc, char **argv) {
  tune_allocator();
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
