/* The shardflow command's subcommands, each described by one definition whose options table drives
 * getopt_long, the typed parsers, `--help` and docs/cli.md (cli/command.c). */
#ifndef SF_CLI_H
#define SF_CLI_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "shardflow/stage.h"

/*
 * One option of a subcommand. row is a stage option row (engine/graph/options.h):
 * its name is the long option without "--", its offset points into the
 * command's own arguments struct, and its type picks the shared parser
 * (count 10k, size 64MiB, duration 30s, enum...), so a bad value is refused
 * naming the option exactly as a graph file's would be. Rows without a
 * default leave the field as the command initialised it.
 */
typedef struct sf_cli_option {
  sf_option row;
  const char *value; /* the value's name in --help ("N", "FILE"); NULL: a flag that sets its bool */
  char short_name;   /* a one-letter alias ('q'), or 0 */
  bool repeat;       /* may be given again: the field is an sf_cli_list, each value appended */
} sf_cli_option;

/* The values of a repeated option, pointing into argv; freed by sf_cli_free(). */
typedef struct sf_cli_list {
  const char **v;
  int n;
} sf_cli_list;

typedef struct sf_cli_command {
  const char *name;
  int (*run)(int argc, char **argv); /* argv[0] is the command's name; returns the exit status */
  const char *args;                  /* synopsis after the name, for usage lines */
  const char *summary;               /* one line for the command list */
  const char *about;                 /* --help text before the options */
  const sf_cli_option *options;      /* ends with a NULL name; -h/--help is implied */
  const char *notes;                 /* --help text after the options, or NULL */
  bool options_first;                /* options end at the first operand (ls: URLs may start with '-') */
} sf_cli_command;

extern const sf_cli_command sf_cli_run, sf_cli_ls, sf_cli_write, sf_cli_cp, sf_cli_worker, sf_cli_keygen, sf_cli_dot, sf_cli_help,
    sf_cli_config, sf_cli_index;

/* The subcommands (cli/main.c), ending with NULL. */
extern const sf_cli_command *const sf_cli_commands[];
/* The subcommand called name, or NULL. */
const sf_cli_command *sf_cli_find_command(const char *name);

/*
 * Parses argv (argv[0] is the command's name) into args with command's
 * table: applies the rows' defaults, then every option given. Returns true
 * when the command should go on, with argv[*first..argc) its operands;
 * false when it printed the help (*status 0) or a usage error naming the
 * option (*status 2). The caller owns args and frees it with sf_cli_free()
 * after a true return; a false return has freed it.
 */
bool sf_cli_parse(const sf_cli_command *command, int argc, char **argv, void *args, int *first, int *status);

/* Frees what sf_cli_parse() allocated in args (the lists of repeated options). */
void sf_cli_free(const sf_cli_command *command, void *args);

/* Prints "shardflow NAME: message", the usage line and a pointer to --help on stderr; returns 2. */
int sf_cli_usage_error(const sf_cli_command *command, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints "shardflow NAME: message" on stderr; returns 1, the status of a run-time failure. */
int sf_cli_fail(const sf_cli_command *command, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for the command named name, from a va_list: for a command's parts, which do not see its definition. */
int sf_cli_vfail(const char *name, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* The command's --help, generated from its definition. */
void sf_cli_print_help(FILE *out, const sf_cli_command *command);

/* The same as a Markdown section (docs/cli.md is generated from it). */
void sf_cli_print_markdown(FILE *out, const sf_cli_command *command);

/*
 * Writes s into out[size] (NUL-terminated; cut at a whole escape when it does not fit) with what a
 * terminal would act on made visible: a backslash as \\, TAB, LF and CR as \t \n \r, other C0
 * controls, DEL and each byte that is not UTF-8 as \xNN, C1 controls and the bidirectional and line
 * separator format characters (sf_cli_is_format_control) as \uNNNN; other UTF-8 as it is. Returns the
 * length of the whole escaped text (as snprintf: size >= that + 1 holds all of it). cli/escape.c.
 */
size_t sf_cli_escape(const char *s, char *out, size_t size);

/* True for a code point that sf_cli_escape writes as \uNNNN: C1 controls, bidirectional marks and
 * overrides, line and paragraph separators. */
bool sf_cli_is_format_control(uint32_t cp);

/* The length of the valid UTF-8 sequence at s (at most n > 0 bytes) with its code point in *code_point
 * (when not NULL), or 0 when it is not one (overlong, a surrogate, past U+10FFFF, cut short). */
size_t sf_cli_utf8_next(const unsigned char *s, size_t n, uint32_t *code_point);

#endif
