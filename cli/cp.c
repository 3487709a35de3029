/* `shardflow cp SRC DST`: atomic copies between local files and http(s), s3://, gs://, az:// (and from hf://). */
#include <stddef.h>
#include <stdio.h>

#include "cli/cli.h"
#include "shardflow/storage.h"

typedef struct cp_args {
  bool no_verify;
} cp_args;

static const sf_cli_option cp_options[] = {
    {.row = {"no-verify", SF_OPT_BOOL, offsetof(cp_args, no_verify),
             .help = "do not read an upload back to compare it"}},
    {.row = {NULL}},
};

static int cp_main(int argc, char **argv) {
  cp_args a = {0};
  int first, status;
  if (!sf_cli_parse(&sf_cli_cp, argc, argv, &a, &first, &status)) return status;
  if (argc - first != 2) return sf_cli_usage_error(&sf_cli_cp, "takes SRC and DST (got %d operand(s))", argc - first);
  sf_error err;
  if (sf_storage_copy(argv[first], argv[first + 1], !a.no_verify, &err) < 0) {
    char line[2048];
    return sf_cli_fail(&sf_cli_cp, "%s", sf_error_format(&err, line, sizeof line));
  }
  return 0;
}

const sf_cli_command sf_cli_cp = {
    .name = "cp",
    .run = cp_main,
    .args = "[--no-verify] SRC DST",
    .summary = "copy files to/from http(s) storage, atomically",
    .about = "Copies a file (a checkpoint, a shard) between a local path and an http(s):// URL, or\n"
             "between two paths. The copy appears under DST at once or not at all: uploads PUT to a\n"
             "temporary name and MOVE it into place (WebDAV), downloads write a temporary file and\n"
             "rename it. Uploads are read back and compared (length and CRC-32) unless --no-verify.\n"
             "Temporary names are DST.partial-HOST-PID-RANDOM (64 random bits from the kernel); a\n"
             "local one is created exclusively, so nothing already at that name (a symlink another\n"
             "user planted) is followed or overwritten.",
    .options = cp_options,
};
