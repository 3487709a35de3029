/* `shardflow keygen NAME [--dir DIR]`: a CURVE key pair for a head or a worker. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "files.h"
#include "transport.h"

typedef struct keygen_args {
  const char *dir;
} keygen_args;

static const sf_cli_option keygen_options[] = {
    {.row = {"dir", SF_OPT_STRING, offsetof(keygen_args, dir), ".",
             .help = "where to write the files; made if missing"},
     .value = "DIR"},
    {.row = {NULL}},
};

static int keygen_main(int argc, char **argv) {
  keygen_args a = {0};
  int first, status;
  if (!sf_cli_parse(&sf_cli_keygen, argc, argv, &a, &first, &status)) return status;
  if (argc - first != 1) return sf_cli_usage_error(&sf_cli_keygen, "takes one NAME (got %d operand(s))", argc - first);
  const char *name = argv[first], *dir = a.dir;
  int e = sf_make_dirs(dir, false); /* `--dir keys` in a fresh checkout: docs/groups.md's recipe */
  if (e < 0) return sf_cli_fail(&sf_cli_keygen, "cannot create the directory %s: %s", dir, strerror(-e));
  char pub[SF_CURVE_KEY_Z85_LEN + 1];
  sf_error err;
  if (sf_curve_keygen(dir, name, pub, &err) < 0) {
    char line[1200];
    return sf_cli_fail(&sf_cli_keygen, "%s", sf_error_format(&err, line, sizeof line));
  }
  printf("wrote %s/%s.key (secret, mode 0600) and %s/%s.pub\npublic key: %s\n", dir, name, dir, name, pub);
  return 0;
}

const sf_cli_command sf_cli_keygen = {
    .name = "keygen",
    .run = keygen_main,
    .args = "NAME [--dir DIR]",
    .summary = "CURVE key pair for a head or worker (NAME.key, NAME.pub)",
    .about = "Writes a CURVE key pair (ZeroMQ certificate text, Z85 keys) for the head or a worker:\n"
             "  DIR/NAME.key  public and secret key, mode 0600: stays on that machine\n"
             "  DIR/NAME.pub  public key only: give it to the other side\n"
             "A head listening on tcp:// needs head.key (secret_key:) and the workers' .pub files\n"
             "(allowed_keys: a file of keys or a directory of *.pub); a worker needs its own .key\n"
             "(--key) and head.pub (--server-key). Existing files are never overwritten.\n"
             "See docs/security.md.",
    .options = keygen_options,
};
