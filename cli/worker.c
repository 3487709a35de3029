/* `shardflow worker --connect ENDPOINT`: join a head's group and run its stages until told to stop. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "options.h"
#include "worker.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

static void usage(FILE *out) {
  fprintf(out,
          "usage: shardflow worker --connect ENDPOINT [--key FILE --server-key FILE | --plaintext]\n"
          "                        [--name NAME] [--threads N] [--credits N] [--connect-timeout SECONDS] [--quiet]\n"
          "\n"
          "Joins a head (a `shardflow run` or an embedding trainer whose graph has a group with\n"
          "`listen: ENDPOINT`), receives the group's stages from it and runs work units through them\n"
          "until the head ends the run. Needs no graph file. SIGTERM or SIGINT leave cleanly: the head\n"
          "hands this worker's unfinished units to other workers.\n"
          "\n"
          "  --connect ENDPOINT   tcp://HOST:PORT or ipc://PATH (the group's listen endpoint)\n"
          "  --key FILE           this worker's key file from `shardflow keygen` (tcp://)\n"
          "  --server-key FILE    the head's public key file, NAME.pub (tcp://)\n"
          "  --plaintext          tcp:// without CURVE (only if the group says plaintext: true)\n"
          "  --name NAME          how the head's logs call this worker (default HOST-PID)\n"
          "  --threads N          pipeline threads (default: as the head says, else this host's CPUs)\n"
          "  --credits N          work units held at once (default 4)\n"
          "  --connect-timeout S  seconds to wait for the head (default 60)\n");
}

int sf_cli_worker(int argc, char **argv) {
  sf_worker_options o = {.stop = &stop_requested};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    bool takes = true;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--plaintext") == 0) {
      o.plaintext = true;
      takes = false;
    } else if (strcmp(a, "--quiet") == 0) {
      o.quiet = true;
      takes = false;
    } else if (strcmp(a, "--exit-with-parent") == 0) {
      o.exit_with_parent = true;
      takes = false;
    } else if (!v) {
      fprintf(stderr, "shardflow worker: %s needs a value (see --help)\n", a);
      return 2;
    } else if (strcmp(a, "--connect") == 0) {
      o.endpoint = v;
    } else if (strcmp(a, "--key") == 0) {
      o.secret_key_file = v;
    } else if (strcmp(a, "--server-key") == 0) {
      o.server_key_file = v;
    } else if (strcmp(a, "--name") == 0) {
      o.name = v;
    } else if (strcmp(a, "--threads") == 0 || strcmp(a, "--credits") == 0) {
      int64_t n;
      if (sf_parse_count(v, &n) < 0 || n < 1 || n > 4096) {
        fprintf(stderr, "shardflow worker: %s takes a whole number 1..4096, not '%s'\n", a, v);
        return 2;
      }
      if (a[2] == 't') o.threads = n;
      else o.credits = n;
    } else if (strcmp(a, "--connect-timeout") == 0) {
      char *end;
      o.connect_timeout = strtod(v, &end);
      if (*end || o.connect_timeout <= 0) {
        fprintf(stderr, "shardflow worker: --connect-timeout takes seconds > 0, not '%s'\n", v);
        return 2;
      }
    } else {
      fprintf(stderr, "shardflow worker: unknown option '%s' (see --help)\n", a);
      return 2;
    }
    if (takes) i++;
  }
  if (!o.endpoint) {
    fprintf(stderr, "shardflow worker: --connect ENDPOINT is required (see --help)\n");
    return 2;
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  sf_error err;
  int rc = sf_worker_run(&o, &err);
  if (rc < 0) {
    char line[2048];
    fprintf(stderr, "shardflow worker: %s\n", sf_error_format(&err, line, sizeof line));
    return 1;
  }
  return 0;
}
