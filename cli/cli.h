/* Subcommands of the shardflow CLI; each returns the process exit status. */
#ifndef SF_CLI_H
#define SF_CLI_H

int sf_cli_run(int argc, char **argv);   /* cli/run.c:   shardflow run GRAPH ... */
int sf_cli_ls(int argc, char **argv);    /* cli/ls.c:    shardflow ls URL... */
int sf_cli_help(int argc, char **argv);  /* cli/help.c:  shardflow help [STAGE|COMMAND] */
int sf_cli_write(int argc, char **argv); /* cli/write.c: shardflow write ... */
int sf_cli_cp(int argc, char **argv);    /* cli/cp.c:    shardflow cp SRC DST */
int sf_cli_worker(int argc, char **argv); /* cli/worker.c: shardflow worker --connect ENDPOINT */
int sf_cli_keygen(int argc, char **argv); /* cli/keygen.c: shardflow keygen NAME [--dir DIR] */

typedef struct sf_cli_command {
  const char *name;
  int (*run)(int argc, char **argv); /* argv[0] is the command's name */
  const char *args, *summary;        /* for the usage list */
} sf_cli_command;

/* The subcommands (cli/main.c), ending with a NULL name. */
extern const sf_cli_command sf_cli_commands[];
/* The subcommand called name, or NULL. */
const sf_cli_command *sf_cli_find_command(const char *name);

#endif
