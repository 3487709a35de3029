/* shardflow index: writes each shard's sample index (key, byte offset and length) for reads by range. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "shard_index.h"
#include "shard_list.h"
#include "url.h"

typedef struct index_args {
  const char *out;
  bool quiet;
} index_args;

static const sf_cli_option index_options[] = {
    {.row = {"out", SF_OPT_STRING, offsetof(index_args, out),
             .help = "write the indexes into DIR (created if missing) instead of next to the shards: for "
                     "shards in read-only folders; give the same DIR as shard_source's index_dir"},
     .value = "DIR"},
    {.row = {"quiet", SF_OPT_BOOL, offsetof(index_args, quiet), .help = "print nothing but errors"},
     .short_name = 'q'},
    {.row = {NULL}},
};

static void report(const sf_error *error) {
  char line[1400];
  fflush(stdout);
  fprintf(stderr, "shardflow index: %s\n", sf_error_format(error, line, sizeof line));
}

/* Indexes one shard. Returns 0, or 1 when it could not be indexed (reported). */
static int index_shard(const char *url, const char *dir, bool quiet) {
  sf_shard_index index;
  sf_error error;
  if (sf_shard_index_build(&index, url, &error) < 0) {
    report(&error);
    return 1;
  }
  char *path = sf_shard_index_path(url, dir);
  int status = 0;
  if (!path || sf_shard_index_write(&index, path, &error) < 0) {
    if (!path) sf_error_set(&error, SF_ENOMEM, SF_AT(.url = url), "out of memory");
    report(&error);
    status = 1;
  } else if (!quiet) {
    printf("%s\t%zu samples\n", path, index.count);
  }
  free(path);
  sf_shard_index_clear(&index);
  return status;
}

static int index_main(int argc, char **argv) {
  index_args a = {0};
  int first, status;
  if (!sf_cli_parse(&sf_cli_index, argc, argv, &a, &first, &status)) return status;
  if (first >= argc) return sf_cli_usage_error(&sf_cli_index, "no shard URL given");
  if (a.out && a.out[0] && mkdir(a.out, 0777) != 0) {
    struct stat st;
    if (stat(a.out, &st) != 0 || !S_ISDIR(st.st_mode))
      return sf_cli_fail(&sf_cli_index, "--out %s: cannot make the directory; give a writable one", a.out);
  }
  for (int i = first; i < argc; i++) {
    sf_shard_list list;
    sf_error error;
    if (sf_shard_list_expand(&list, argv[i], &error) < 0) {
      report(&error);
      return error.code == SF_EINVAL || error.code == SF_ETOOBIG ? 2 : 1;
    }
    for (size_t j = 0; j < list.count; j++) {
      if (sf_url_is_remote(list.urls[j]) && (!a.out || !a.out[0])) {
        int usage = sf_cli_usage_error(&sf_cli_index, "%s is remote: give --out DIR for its index (and the same DIR "
                                       "as shard_source's index_dir)", list.urls[j]);
        sf_shard_list_clear(&list);
        return usage;
      }
      status |= index_shard(list.urls[j], a.out, a.quiet);
    }
    sf_shard_list_clear(&list);
  }
  if (fflush(stdout) != 0) {
    perror("shardflow index: writing the listing");
    return 1;
  }
  return status;
}

const sf_cli_command sf_cli_index = {
    .name = "index",
    .run = index_main,
    .args = "[--out DIR] [-q] URL...",
    .summary = "write the sample index of shards (for order: global / block)",
    .about = "Reads each shard once and writes its index: every sample's key, byte offset and length,\n"
             "and the shard's size and modification time, next to the shard (SHARD.sfidx) or into\n"
             "--out DIR. shard_source's order: global and order: block read samples by byte range\n"
             "with it; an index whose shard changed since (size or mtime) is refused there, naming\n"
             "both files. Shards are uncompressed tar files: paths, file://, or http(s)://, s3:// and\n"
             "gs:// URLs (these need --out; their ETag is recorded and every ranged read is pinned to it),\n"
             "and may be brace patterns (shard-{000..009}.tar) or @FILE lists. Prints one line per shard:\n"
             "the index's path and its sample count.",
    .options = index_options,
    .notes = "Exit status: 0 when every shard was indexed, 1 when any could not be (reported on\n"
             "stderr: a damaged or compressed shard), 2 for usage errors.",
};
