/* `shardflow help [STAGE]`: stages and options, printed from the stages' own tables. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/options.h"

int sf_cli_help(int argc, char **argv) {
  void *it = NULL;
  const sf_stage_def *def;
  if (argc < 2) {
    printf("stages (shardflow help STAGE for options):\n");
    while ((def = sf_stage_iterate(&it))) printf("  %-14s %s\n", def->name, def->summary);
    printf("\ngraph settings: seed (seed), epochs (count, 0 = forever), error_policy (skip|fail),\n"
           "queue_size (count, items per edge); every stage also takes `name`, and map stages `replicas`.\n");
    return 0;
  }
  int status = 0;
  for (int i = 1; i < argc; i++) {
    def = sf_stage_find(argv[i]);
    if (!def) {
      fprintf(stderr, "shardflow help: unknown stage '%s'; stages:", argv[i]);
      it = NULL;
      while ((def = sf_stage_iterate(&it))) fprintf(stderr, " %s", def->name);
      fprintf(stderr, "\n");
      status = 2;
      continue;
    }
    sf_stage_print_help(stdout, def);
  }
  return status;
}
