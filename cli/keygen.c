/* `shardflow keygen NAME [--dir DIR]`: a CURVE key pair for a head or a worker. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "files.h"
#include "transport.h"

static const char keygen_usage[] = "usage: shardflow keygen NAME [--dir DIR]\n";

int sf_cli_keygen(int argc, char **argv) {
  const char *name = NULL, *dir = ".";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("%s\n"
             "Writes a CURVE key pair (ZeroMQ certificate text, Z85 keys) for the head or a worker:\n"
             "  DIR/NAME.key  public and secret key, mode 0600: stays on that machine\n"
             "  DIR/NAME.pub  public key only: give it to the other side\n"
             "A head listening on tcp:// needs head.key (secret_key:) and the workers' .pub files\n"
             "(allowed_keys: a file of keys or a directory of *.pub); a worker needs its own .key\n"
             "(--key) and head.pub (--server-key). DIR is made if missing; existing files are never\n"
             "overwritten.\n"
             "See docs/security.md.\n",
             keygen_usage);
      return 0;
    } else if (strcmp(argv[i], "--dir") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "shardflow keygen: --dir needs a directory\n");
        return 2;
      }
      dir = argv[++i];
    } else if (strncmp(argv[i], "--dir=", 6) == 0) {
      dir = argv[i] + 6;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "shardflow keygen: unknown option '%s' (see --help)\n", argv[i]);
      return 2;
    } else if (!name) {
      name = argv[i];
    } else {
      fprintf(stderr, "shardflow keygen: takes one NAME (got '%s' too)\n%s", argv[i], keygen_usage);
      return 2;
    }
  }
  if (!name) {
    fprintf(stderr, "%s", keygen_usage);
    return 2;
  }
  int e = sf_make_dirs(dir, false); /* `--dir keys` in a fresh checkout: the README's recipe */
  if (e < 0) {
    fprintf(stderr, "shardflow keygen: cannot create the directory %s: %s\n", dir, strerror(-e));
    return 1;
  }
  char pub[SF_CURVE_KEY_Z85_LEN + 1];
  sf_error err;
  if (sf_curve_keygen(dir, name, pub, &err) < 0) {
    char line[1200];
    fprintf(stderr, "shardflow keygen: %s\n", sf_error_format(&err, line, sizeof line));
    return 1;
  }
  printf("wrote %s/%s.key (secret, mode 0600) and %s/%s.pub\npublic key: %s\n", dir, name, dir, name, pub);
  return 0;
}
