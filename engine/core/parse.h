/* Typed value parsers shared by option tables and the CLI (nginx's typed setters). */
#ifndef SF_ENGINE_PARSE_H
#define SF_ENGINE_PARSE_H

#include <stdbool.h>
#include <stdint.h>

#include "shardflow/stage.h"

/* A size in bytes: 512, 64k, 64KiB, 16MiB, 1G (k = 1000, Ki = 1024; "_" between digits). Returns 0 or SF_EOPTION. */
int sf_parse_size(const char *text, int64_t *bytes);

/* A duration in seconds: 250ms, 30s, 5m, 1h; a plain number is seconds. Returns 0 or SF_EOPTION. */
int sf_parse_duration(const char *text, double *seconds);

/* A whole count >= 0: 10k, 2M, 1_000. Returns 0 or SF_EOPTION. */
int sf_parse_count(const char *text, int64_t *count);

/* true/yes/on/1 or false/no/off/0, any case. Returns 0 or SF_EOPTION. */
int sf_parse_bool(const char *text, bool *out);

/* A whole number (decimal, 0x hex or 0 octal as strtoll; "_" between digits). Returns 0 or SF_EOPTION. */
int sf_parse_int(const char *text, int64_t *value);

/* A 64-bit seed: a non-negative integer up to 2^64-1 (decimal or 0x hex). Returns 0 or SF_EOPTION. */
int sf_parse_seed(const char *text, uint64_t *value);

/* A finite floating-point number. Returns 0 or SF_EOPTION. */
int sf_parse_float(const char *text, double *value);

/* Up to 8 numbers, "0.1,0.2,0.3" or "[0.1, 0.2, 0.3]". Returns 0 or SF_EOPTION. */
int sf_parse_float_list(const char *text, sf_float_list *out);

/*
 * Items separated by commas, "a,b" or "[a, b]" (a YAML list reaches here joined as "a, b"), each trimmed of
 * blanks; empty ones are left out. On success *out holds them in one allocation the caller frees with
 * free((void *)out->v) (NULL for no items). Returns 0, SF_ETOOBIG (more than SF_NAME_LIST_MAX items) or
 * SF_ENOMEM; *out is unchanged on failure.
 */
int sf_parse_name_list(const char *text, sf_name_list *out);

#endif
