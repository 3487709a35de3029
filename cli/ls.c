/* shardflow ls: lists the samples of shards (key and fields, or JSON lines) as tar_split would see them. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "shard_list.h"
#include "tar_reader.h"

typedef struct ls_args {
  bool json, allow_pipe, shards;
} ls_args;

static const sf_cli_option ls_options[] = {
    {.row = {"json", SF_OPT_BOOL, offsetof(ls_args, json),
             .help = "one JSON object per sample: __key__, __url__, offset, fields and sizes (bytes per field)"}},
    {.row = {"allow-pipe", SF_OPT_BOOL, offsetof(ls_args, allow_pipe),
             .help = "allow pipe:CMD URLs (they run shell commands)"}},
    {.row = {"shards", SF_OPT_BOOL, offsetof(ls_args, shards),
             .help = "print the shard URLs the arguments expand to, one per line, without reading the shards"}},
    {.row = {NULL}},
};

/* Writes s with control characters, bidirectional overrides and bytes that are not UTF-8 escaped (sf_cli_escape):
 * a key could otherwise move the cursor, recolour the terminal or forge a line of the listing. */
static void put_escaped(FILE *out, const char *s) {
  char small[512];
  size_t need = sf_cli_escape(s, small, sizeof small);
  if (need < sizeof small) {
    fputs(small, out);
    return;
  }
  char *big = malloc(need + 1);
  if (big) sf_cli_escape(s, big, need + 1);
  fputs(big ? big : small, out); /* out of memory: the escaped text, cut */
  free(big);
}

/* Writes s as a JSON string; bytes that are not UTF-8 become U+FFFD, so the line stays JSON. */
static void put_json_string(FILE *out, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  fputc('"', out);
  while (n > 0) {
    unsigned char c = *p;
    if (c == '"' || c == '\\') {
      fputc('\\', out);
      fputc(c, out);
    } else if (c == '\n') {
      fputs("\\n", out);
    } else if (c == '\t') {
      fputs("\\t", out);
    } else if (c == '\r') {
      fputs("\\r", out);
    } else if (c < 0x20 || c == 0x7f) {
      fprintf(out, "\\u%04x", c);
    } else if (c >= 0x80) {
      size_t len = sf_cli_utf8_next(p, n, NULL);
      if (len == 0) {
        fputs("\\ufffd", out);
        len = 1;
      } else {
        fwrite(p, 1, len, out);
      }
      p += len;
      n -= len;
      continue;
    } else {
      fputc(c, out);
    }
    p++;
    n--;
  }
  fputc('"', out);
}

static void print_sample(FILE *out, const sf_sample *s, bool json) {
  if (!json) {
    put_escaped(out, s->key);
    fputc('\t', out);
    for (int i = 0; i < s->n_fields; i++) {
      if (i) fputc(',', out);
      put_escaped(out, s->fields[i].name);
    }
    fputc('\n', out);
    return;
  }
  fputs("{\"__key__\": ", out);
  put_json_string(out, s->key);
  fputs(", \"__url__\": ", out);
  put_json_string(out, sf_sample_url(s));
  fprintf(out, ", \"offset\": %lld, \"fields\": [", (long long)s->offset);
  for (int i = 0; i < s->n_fields; i++) {
    if (i) fputs(", ", out);
    put_json_string(out, s->fields[i].name);
  }
  fputs("], \"sizes\": [", out);
  for (int i = 0; i < s->n_fields; i++)
    fprintf(out, "%s%lld", i ? ", " : "", (long long)sf_tensor_nbytes(&s->fields[i].tensor));
  fputs("]}\n", out);
}

static void report(const sf_error *error) {
  char line[1400];
  fflush(stdout);
  fprintf(stderr, "shardflow ls: %s\n", sf_error_format(error, line, sizeof line));
}

/* Lists one shard. Returns 0 when it was read cleanly, 1 otherwise. */
static int list_shard(const char *url, const sf_shard_reader_options *options, bool json) {
  sf_tar_reader *tar;
  sf_error error;
  if (sf_tar_reader_open(&tar, url, options, &error) < 0) {
    report(&error);
    return 1;
  }
  int status = 0;
  for (;;) {
    sf_sample *sample = NULL;
    int rc = sf_tar_reader_next(tar, &sample, &error);
    if (rc == SF_EOF) break;
    /* With an error, a sample comes back only when the problem spoils that sample alone. */
    bool goes_on = rc == 0 || sample;
    if (sample) print_sample(stdout, sample, json);
    sf_sample_destroy(&sample);
    if (rc < 0) {
      report(&error);
      status = 1;
      if (!goes_on) break;
    }
  }
  sf_tar_reader_close(&tar);
  return status;
}

static int ls_main(int argc, char **argv) {
  ls_args a = {0};
  int first, status;
  if (!sf_cli_parse(&sf_cli_ls, argc, argv, &a, &first, &status)) return status;
  bool json = a.json, shards_only = a.shards;
  sf_shard_reader_options options = {.allow_pipe = a.allow_pipe};
  if (first >= argc) return sf_cli_usage_error(&sf_cli_ls, "no shard URL given");
  /* Expand every pattern first: a typo in the last one should not wait for the first to stream. */
  int n = argc - first;
  sf_shard_list *lists = calloc((size_t)n, sizeof *lists);
  if (!lists) return sf_cli_fail(&sf_cli_ls, "out of memory");
  for (int i = 0; i < n && status == 0; i++) {
    sf_error error;
    if (sf_shard_list_expand(&lists[i], argv[first + i], &error) < 0) {
      report(&error);
      /* A bad pattern is a usage error; a store that refused or failed a listing is not. */
      status = error.code == SF_EINVAL || error.code == SF_ETOOBIG ? 2 : 1;
    }
  }
  bool expanded = status == 0;
  for (int i = 0; i < n && expanded && shards_only; i++)
    for (size_t j = 0; j < lists[i].count; j++) puts(lists[i].urls[j]);
  for (int i = 0; i < n && expanded && !shards_only; i++)
    for (size_t j = 0; j < lists[i].count; j++)
      status |= list_shard(lists[i].urls[j], &options, json);
  for (int i = 0; i < n; i++) sf_shard_list_clear(&lists[i]);
  free(lists);
  if (fflush(stdout) != 0) {
    perror("shardflow ls: writing the listing");
    return 1;
  }
  return status;
}

const sf_cli_command sf_cli_ls = {
    .name = "ls",
    .run = ls_main,
    .args = "[--json] [--allow-pipe] [--shards] URL...",
    .summary = "list the samples of shards",
    .about = "Lists the samples of tar shards (and TFRecord shards' records), grouped as tar_split groups them: one line\n"
             "per sample with its key, a TAB and its field names in member order\n"
             "(escaped: a backslash as \\\\, TAB, newline and CR as \\t \\n \\r, other\n"
             "control characters and bytes that are not UTF-8 as \\xNN, C1 controls and\n"
             "bidirectional overrides as \\uNNNN; --json escapes as JSON does).\n"
             "URLs are paths, file://, http(s):// or pipe:CMD, and may be brace patterns\n"
             "(shard-{000..009}.tar) or @FILE lists. s3://, gs://, az:// and hf:// URLs\n"
             "ending in '/' are prefixes: every .tar, .tar.gz, .tgz and .tar.zst object\n"
             "under them.\n"
             "Options come before the first URL.",
    .options = ls_options,
    .notes = "Exit status: 0 when every shard was read cleanly, 1 when any shard or\n"
             "sample had an error (reported on stderr), 2 for usage errors.",
    .options_first = true,
};
