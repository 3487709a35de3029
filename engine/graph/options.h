/* Typed option parsers shared by every stage (nginx's typed setters, FFmpeg's AVOption table). */
#ifndef SF_ENGINE_OPTIONS_H
#define SF_ENGINE_OPTIONS_H

#include <stddef.h>
#include <stdio.h>

#include "parse.h"
#include "shardflow/stage.h"

/* Finds a row by name, or NULL. */
const sf_option *sf_option_find(const sf_option *table, const char *name);

/*
 * Parses text with the row's parser and stores it into priv at the row's
 * offset (replacing an earlier string value). Returns 0, or SF_EOPTION with a
 * reason (what was expected, the range, the valid names) in why.
 */
int sf_option_parse(const sf_option *option, const char *text, void *priv, char *why,
                    size_t why_size);

/* Applies every row's default. Returns 0, or SF_EINTERNAL when a default does not parse. */
int sf_options_set_defaults(const sf_option *table, void *priv, char *why, size_t why_size);

/* Frees what the table's SF_OPT_STRING and SF_OPT_NAME_LIST rows own in priv. */
void sf_options_free(const sf_option *table, void *priv);

/* Writes the valid option names as "a, b, c" into buf. */
void sf_options_names(const sf_option *table, char *buf, size_t size);

/* Short type name for help text ("count", "size", "duration", "a|b|c"...) into buf. */
const char *sf_option_type_text(const sf_option *option, char *buf, size_t size);

/* Prints one stage's help (summary, ports, every option with type, default, range, help). */
void sf_stage_print_help(FILE *out, const sf_stage_def *def);

/* The same as a Markdown section (docs/stages.md is generated from it). */
void sf_stage_print_markdown(FILE *out, const sf_stage_def *def);

/* A table's rows as sf_stage_print_help prints a stage's options (the graph settings use it too). */
void sf_options_print_help(FILE *out, const sf_option *table);

/* A table's rows as a Markdown table, its first column headed what ("option", "setting"); "No options." when
 * it has none. */
void sf_options_print_markdown(FILE *out, const sf_option *table, const char *what);

#endif
