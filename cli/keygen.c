/* `shardflow keygen NAME [--dir DIR]`: a CURVE key pair for a head or a worker. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "transport.h"

typedef struct keygen_args {
  const char *dir;
} keygen_args;

static const sf_cli_option keygen_options[] = {
    {.row = {"dir", SF_OPT_STRING, offsetof(keygen_args, dir), ".",
             .help = "where to write the files; made (mode 0700) if missing"},
     .value = "DIR"},
    {.row = {NULL}},
};

/*
 * mkdir -p with mode 0700 for every directory it makes, whatever the umask: a key directory others could
 * write lets them swap a key. Directories that exist are left as they are. Returns 0 or -errno.
 */
static int make_private_dirs(const char *path) {
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return -ENAMETOOLONG;
  for (char *p = dir + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char c = *p;
    *p = '\0';
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) return -errno;
    *p = c;
    if (!c) return 0;
  }
}

static int keygen_main(int argc, char **argv) {
  keygen_args a = {0};
  int first, status;
  if (!sf_cli_parse(&sf_cli_keygen, argc, argv, &a, &first, &status)) return status;
  if (argc - first != 1) return sf_cli_usage_error(&sf_cli_keygen, "takes one NAME (got %d operand(s))", argc - first);
  const char *name = argv[first], *dir = a.dir;
  int e = make_private_dirs(dir); /* `--dir keys` in a fresh checkout: docs/groups.md's recipe */
  if (e < 0) return sf_cli_fail(&sf_cli_keygen, "cannot create the directory %s: %s", dir, strerror(-e));
  struct stat st;
  if (stat(dir, &st) == 0 && (st.st_mode & 022))
    fprintf(stderr, "shardflow keygen: warning: %s is writable by %s (mode %03o): they could replace the keys in "
            "it; run `chmod go-w %s`\n", dir, (st.st_mode & 002) ? "others" : "its group",
            (unsigned)(st.st_mode & 0777), dir);
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
