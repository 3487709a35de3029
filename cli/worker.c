/* `shardflow worker --connect ENDPOINT`: join a head's group and run its stages until told to stop. */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "rendezvous.h"
#include "worker.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

/* The engine's worker options, and the repeated options' lists. */
typedef struct worker_args {
  sf_worker_options o;
  sf_cli_list connect, server_keys, rendezvous, allowed_plugins;
} worker_args;

#define W(field) offsetof(worker_args, o.field)

static const sf_cli_option worker_options[] = {
    {.row = {"connect", SF_OPT_STRING, offsetof(worker_args, connect),
             .help = "tcp://HOST:PORT or ipc://PATH (a group's listen endpoint); required unless --rendezvous; "
                     "repeat it to serve several heads (every rank of a job) from one pool of workers"},
     .value = "ENDPOINT", .repeat = true},
    {.row = {"rendezvous", SF_OPT_STRING, offsetof(worker_args, rendezvous),
             .help = "instead of --connect and --server-key: wait for the file a head's group `rendezvous:` writes "
                     "(its endpoint and public key; the job's directory under a scheduler); repeat it to serve "
                     "several heads (one file per rank)"},
     .value = "FILE", .repeat = true},
    {.row = {"key", SF_OPT_STRING, W(secret_key_file),
             .help = "this worker's key file from `shardflow keygen` (tcp://)"},
     .value = "FILE"},
    {.row = {"server-key", SF_OPT_STRING, offsetof(worker_args, server_keys),
             .help = "the head's public key file, NAME.pub (tcp://): once for every head, or once per --connect in "
                     "the same order"},
     .value = "FILE", .repeat = true},
    {.row = {"plaintext", SF_OPT_BOOL, W(plaintext),
             .help = "tcp:// without CURVE (only if the group says plaintext: true); without it a worker never "
                     "goes plaintext, whatever a rendezvous file says"}},
    {.row = {"allow-plugin", SF_OPT_STRING, offsetof(worker_args, allowed_plugins),
             .help = "a plugin file this worker may load when a head names a plugin of that file name (NAME.so); "
                     "others come from its own SHARDFLOW_PLUGIN_PATH, never from a path the head sends"},
     .value = "FILE", .repeat = true},
    {.row = {"name", SF_OPT_STRING, W(name),
             .help = "how the head's logs call this worker (default HOST-PID)"},
     .value = "NAME"},
    {.row = {"threads", SF_OPT_COUNT, W(threads), NULL, 1, 4096,
             "pipeline threads (default: as the head says, else this host's CPUs)"},
     .value = "N"},
    {.row = {"credits", SF_OPT_COUNT, W(credits), "4", 1, 4096,
             "work units decoding at once, shared evenly by the heads with work; each head may queue as many"},
     .value = "N"},
    {.row = {"connect-timeout", SF_OPT_DURATION, W(connect_timeout), "60s", 0.001, 1e6,
             "how long to wait for the head"},
     .value = "SECONDS"},
    {.row = {"quiet", SF_OPT_BOOL, W(quiet), .help = "only errors"}},
    {.row = {"exit-with-parent", SF_OPT_BOOL, W(exit_with_parent),
             .help = "end when the parent process ends (a head starting local workers passes it)"}},
    {.row = {"shm-fd", SF_OPT_COUNT, W(shm_fd), NULL, 3, 1048576,
             "a shared-memory ring inherited from the head that started this worker (it passes it itself)"},
     .value = "FD"},
    {.row = {NULL}},
};

static int worker_main(int argc, char **argv) {
  worker_args a = {.o = {.stop = &stop_requested}};
  int first, status;
  if (!sf_cli_parse(&sf_cli_worker, argc, argv, &a, &first, &status)) return status;
  int rc = 2;
  if (first < argc) {
    sf_cli_usage_error(&sf_cli_worker, "takes no operands (got '%s')", argv[first]);
    goto out;
  }
  if (a.connect.n && a.rendezvous.n) {
    sf_cli_usage_error(&sf_cli_worker, "give --connect or --rendezvous, not both");
    goto out;
  }
  if (!a.connect.n && !a.rendezvous.n) {
    sf_cli_usage_error(&sf_cli_worker, "--connect ENDPOINT is required");
    goto out;
  }
  if (a.server_keys.n > 1 && a.server_keys.n != a.connect.n) {
    sf_cli_usage_error(&sf_cli_worker, "%d --server-key for %d --connect: give one for all heads, or one per "
                       "--connect in the same order", a.server_keys.n, a.connect.n);
    goto out;
  }
  if (a.o.plaintext && a.o.secret_key_file) {
    sf_cli_usage_error(&sf_cli_worker, "give --plaintext or --key, not both (plaintext has no keys)");
    goto out;
  }
  sf_worker_options o = a.o;
  o.allowed_plugins = a.allowed_plugins.v;
  o.n_allowed_plugins = a.allowed_plugins.n;
  o.endpoints = a.connect.v;
  o.n_endpoints = a.connect.n;
  o.server_key_files = a.server_keys.v;
  o.n_server_keys = a.server_keys.n;
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  sf_error err;
  rc = 0;
  /* Each file is written once its head listens: wait for them as for the heads. */
  int n = a.rendezvous.n;
  char(*endpoints)[600] = n ? calloc((size_t)n, sizeof *endpoints) : NULL;
  const char **endpoint_list = n ? calloc((size_t)n, sizeof *endpoint_list) : NULL;
  if (n && (!endpoints || !endpoint_list)) {
    rc = sf_cli_fail(&sf_cli_worker, "out of memory");
    goto out_rendezvous;
  }
  for (int i = 0; i < n; i++) {
    bool plaintext;
    if (sf_rendezvous_read(a.rendezvous.v[i], o.connect_timeout, &stop_requested, endpoints[i], sizeof endpoints[i],
                           &plaintext, &err) < 0) {
      char line[2048];
      /* SIGTERM before the head came (scancel, kubectl scale) is a clean leave */
      if (!stop_requested) rc = sf_cli_fail(&sf_cli_worker, "%s", sf_error_format(&err, line, sizeof line));
      goto out_rendezvous;
    }
    /* Whoever can write the file may not choose plaintext for this worker: only its own --plaintext does. An
     * ipc:// head is local and never has CURVE (its socket file's permissions guard it): its file says plaintext. */
    bool local = strncmp(endpoints[i], "ipc://", 6) == 0;
    if (plaintext && !a.o.plaintext && !local) {
      rc = sf_cli_fail(&sf_cli_worker,
                       "%s says its head is plaintext (no CURVE key), and this worker was not started with "
                       "--plaintext: refused. Start it with --plaintext (and no --key) only if that head is meant to "
                       "be unauthenticated; otherwise check who wrote the file",
                       a.rendezvous.v[i]);
      goto out_rendezvous;
    }
    if (!plaintext && a.o.plaintext) {
      rc = sf_cli_fail(&sf_cli_worker, "%s holds its head's public key (CURVE), and this worker was started with "
                       "--plaintext: drop --plaintext and give --key", a.rendezvous.v[i]);
      goto out_rendezvous;
    }
    endpoint_list[i] = endpoints[i];
  }
  if (n) {
    o.endpoints = endpoint_list;
    o.n_endpoints = n;
    o.server_key_files = o.plaintext ? NULL : a.rendezvous.v; /* each file is its head's key */
    o.n_server_keys = o.plaintext ? 0 : n;
  }
  if (sf_worker_run(&o, &err) < 0) {
    char line[2048];
    rc = sf_cli_fail(&sf_cli_worker, "%s", sf_error_format(&err, line, sizeof line));
  }
out_rendezvous:
  free(endpoints);
  free(endpoint_list);
out:
  sf_cli_free(&sf_cli_worker, &a);
  return rc;
}

const sf_cli_command sf_cli_worker = {
    .name = "worker",
    .run = worker_main,
    .args = "--connect ENDPOINT [--connect ENDPOINT...] [--key K --server-key K] | --rendezvous FILE [--key K] "
            "[--allow-plugin FILE...]",
    .summary = "join a head's group and run its stages",
    .about = "Joins a head (a `shardflow run` or an embedding trainer whose graph has a group with\n"
             "`listen: ENDPOINT`), receives the group's stages from it and runs work units through them\n"
             "until the head ends the run. With --connect repeated it serves several heads (every rank of a\n"
             "job) at once, each with its own stages, sharing its CPUs evenly among those with work; it ends\n"
             "when every head has ended. Needs no graph file. SIGTERM or SIGINT leave cleanly: the head\n"
             "hands this worker's unfinished units to other workers. The plugins a head's stages need are\n"
             "loaded by file name from this host's plugin path or --allow-plugin, never from a head's path.",
    .options = worker_options,
};
