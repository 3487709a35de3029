/* `shardflow worker --connect ENDPOINT`: join a head's group and run its stages until told to stop. */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>

#include "cli/cli.h"
#include "rendezvous.h"
#include "worker.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
  (void)sig;
  stop_requested = 1;
}

/* The rows point straight into the engine's worker options. */
static const sf_cli_option worker_options[] = {
    {.row = {"connect", SF_OPT_STRING, offsetof(sf_worker_options, endpoint),
             .help = "tcp://HOST:PORT or ipc://PATH (the group's listen endpoint); required unless --rendezvous"},
     .value = "ENDPOINT"},
    {.row = {"rendezvous", SF_OPT_STRING, offsetof(sf_worker_options, rendezvous),
             .help = "instead of --connect and --server-key: wait for the file a head's group `rendezvous:` writes "
                     "(its endpoint and public key; the job's directory under a scheduler)"},
     .value = "FILE"},
    {.row = {"key", SF_OPT_STRING, offsetof(sf_worker_options, secret_key_file),
             .help = "this worker's key file from `shardflow keygen` (tcp://)"},
     .value = "FILE"},
    {.row = {"server-key", SF_OPT_STRING, offsetof(sf_worker_options, server_key_file),
             .help = "the head's public key file, NAME.pub (tcp://)"},
     .value = "FILE"},
    {.row = {"plaintext", SF_OPT_BOOL, offsetof(sf_worker_options, plaintext),
             .help = "tcp:// without CURVE (only if the group says plaintext: true)"}},
    {.row = {"name", SF_OPT_STRING, offsetof(sf_worker_options, name),
             .help = "how the head's logs call this worker (default HOST-PID)"},
     .value = "NAME"},
    {.row = {"threads", SF_OPT_COUNT, offsetof(sf_worker_options, threads), NULL, 1, 4096,
             "pipeline threads (default: as the head says, else this host's CPUs)"},
     .value = "N"},
    {.row = {"credits", SF_OPT_COUNT, offsetof(sf_worker_options, credits), "4", 1, 4096, "work units held at once"},
     .value = "N"},
    {.row = {"connect-timeout", SF_OPT_DURATION, offsetof(sf_worker_options, connect_timeout), "60s", 0.001, 1e6,
             "how long to wait for the head"},
     .value = "SECONDS"},
    {.row = {"quiet", SF_OPT_BOOL, offsetof(sf_worker_options, quiet), .help = "only errors"}},
    {.row = {"exit-with-parent", SF_OPT_BOOL, offsetof(sf_worker_options, exit_with_parent),
             .help = "end when the parent process ends (a head starting local workers passes it)"}},
    {.row = {NULL}},
};

static int worker_main(int argc, char **argv) {
  sf_worker_options o = {.stop = &stop_requested};
  int first, status;
  if (!sf_cli_parse(&sf_cli_worker, argc, argv, &o, &first, &status)) return status;
  if (first < argc) return sf_cli_usage_error(&sf_cli_worker, "takes no operands (got '%s')", argv[first]);
  if (o.endpoint && o.rendezvous)
    return sf_cli_usage_error(&sf_cli_worker, "give --connect or --rendezvous, not both");
  if (!o.endpoint && !o.rendezvous) return sf_cli_usage_error(&sf_cli_worker, "--connect ENDPOINT is required");
  struct sigaction sa = {.sa_handler = on_signal};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  sf_error err;
  char endpoint[600];
  bool plaintext;
  if (o.rendezvous) { /* the file is written once the head listens: wait for it as for the head */
    if (sf_rendezvous_read(o.rendezvous, o.connect_timeout, &stop_requested, endpoint, sizeof endpoint, &plaintext,
                           &err) < 0) {
      if (stop_requested) return 0; /* SIGTERM before the head came (scancel, kubectl scale): a clean leave */
      char line[2048];
      return sf_cli_fail(&sf_cli_worker, "%s", sf_error_format(&err, line, sizeof line));
    }
    o.endpoint = endpoint;
    if (plaintext) o.plaintext = true;
    else o.server_key_file = o.rendezvous;
  }
  if (sf_worker_run(&o, &err) < 0) {
    char line[2048];
    return sf_cli_fail(&sf_cli_worker, "%s", sf_error_format(&err, line, sizeof line));
  }
  return 0;
}

const sf_cli_command sf_cli_worker = {
    .name = "worker",
    .run = worker_main,
    .args = "--connect ENDPOINT [--key K --server-key K] | --rendezvous FILE [--key K]",
    .summary = "join a head's group and run its stages",
    .about = "Joins a head (a `shardflow run` or an embedding trainer whose graph has a group with\n"
             "`listen: ENDPOINT`), receives the group's stages from it and runs work units through them\n"
             "until the head ends the run. Needs no graph file. SIGTERM or SIGINT leave cleanly: the head\n"
             "hands this worker's unfinished units to other workers.",
    .options = worker_options,
};
