/* `shardflow cp SRC DST`: atomic copies between local files and http(s) object stores. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "shardflow/storage.h"

int sf_cli_cp(int argc, char **argv) {
  bool verify = true;
  const char *paths[2];
  int n = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--no-verify") == 0) {
      verify = false;
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: shardflow cp [--no-verify] SRC DST\n\n"
             "Copies a file (a checkpoint, a shard) between a local path and an http(s):// URL, or\n"
             "between two paths. The copy appears under DST at once or not at all: uploads PUT to a\n"
             "temporary name and MOVE it into place (WebDAV), downloads write a temporary file and\n"
             "rename it. Uploads are read back and compared (length and CRC-32) unless --no-verify.\n");
      return 0;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "shardflow cp: unknown option '%s' (see --help)\n", argv[i]);
      return 2;
    } else if (n < 2) {
      paths[n++] = argv[i];
    } else {
      fprintf(stderr, "shardflow cp: takes SRC and DST only\n");
      return 2;
    }
  }
  if (n != 2) {
    fprintf(stderr, "usage: shardflow cp [--no-verify] SRC DST\n");
    return 2;
  }
  sf_error err;
  if (sf_storage_copy(paths[0], paths[1], verify, &err) < 0) {
    char line[2048];
    fprintf(stderr, "shardflow cp: %s\n", sf_error_format(&err, line, sizeof line));
    return 1;
  }
  return 0;
}
