/*
 * A group's head: the worker processes it starts on its own host (`processes:`), each a `shardflow worker`
 * connected over the head's private ipc:// socket with a shared-memory ring of its own, started again
 * when it dies (a few times).  engine/group/head.h says what the head's files share.
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "head.h"
#include "log.h"

extern char **environ;

static const char *worker_executable(sf_head *r) {
  if (r->worker_command[0]) return r->worker_command;
  static char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    const char *base = strrchr(self, '/');
    if (base && strcmp(base + 1, "shardflow") == 0) return self;
  }
  const char *env = getenv("SHARDFLOW_BIN");
  if (env && env[0]) return env;
  /* embedded (a Python trainer): the CLI next to libshardflow (a build tree) or in ../bin (an install) */
  Dl_info info;
  static char near[PATH_MAX];
  if (dladdr((void *)worker_executable, &info) && info.dli_fname && strchr(info.dli_fname, '/')) {
    const char *slash = strrchr(info.dli_fname, '/');
    int dir = (int)(slash - info.dli_fname);
    snprintf(near, sizeof near, "%.*s/shardflow", dir, info.dli_fname);
    if (access(near, X_OK) == 0) return near;
    snprintf(near, sizeof near, "%.*s/../bin/shardflow", dir, info.dli_fname);
    if (access(near, X_OK) == 0) return near;
  }
  return "shardflow";
}

/*
 * A worker loads only plugins it finds itself or was allowed by its command line, never a path a head
 * sends: the plugins this head loaded by path are passed to its own processes with --allow-plugin.
 * Returns the argv slots used from at (2 per plugin); *owned gets the strings to free.
 */
static int allow_plugins(const sf_head *r, char **argv, int at, char **owned) {
  int n = 0;
  for (int i = 0; r->stages && i < r->stages->n_plugins; i++) {
    const char *entry = r->stages->plugins[i].name;
    if (!strchr(entry, '/')) continue; /* a name: the worker searches the same SHARDFLOW_PLUGIN_PATH */
    /* absolute, but links unresolved: the worker matches the head's entry to it by file name */
    char cwd[PATH_MAX];
    if (entry[0] != '/' && getcwd(cwd, sizeof cwd) && asprintf(&owned[i], "%s/%s", cwd, entry) < 0) owned[i] = NULL;
    argv[at + n++] = (char *)"--allow-plugin";
    argv[at + n++] = owned[i] ? owned[i] : (char *)entry;
  }
  return n;
}

int sf_head_spawn_worker(sf_head *r, int index, sf_error *error) {
  const char *exe = worker_executable(r);
  char endpoint[128], name[64];
  snprintf(endpoint, sizeof endpoint, "ipc://%s", r->ipc_path);
  snprintf(name, sizeof name, "%s-local-%d", sf_node_name(r->node), index);
  char shm_fd[24] = "";
  int n_plugins = r->stages ? r->stages->n_plugins : 0;
  char **argv = calloc((size_t)(10 + 2 * n_plugins), sizeof *argv);
  char **owned = calloc((size_t)(n_plugins + 1), sizeof *owned);
  if (!argv || !owned) {
    free(argv);
    free(owned);
    return sf_error_set(error, SF_ENOMEM, SF_AT(.stage = sf_node_name(r->node)), "out of memory");
  }
  char *base[] = {(char *)"shardflow", (char *)"worker", (char *)"--connect", endpoint, (char *)"--name", name,
                  (char *)"--exit-with-parent"};
  int argc = (int)(sizeof base / sizeof *base);
  memcpy(argv, base, sizeof base);
  argc += allow_plugins(r, argv, argc, owned);
  /* a fresh ring for every process started: views of a dead one's ring keep that one mapped */
  sf_shm_ring_unref(&r->rings[index]);
  int fd = -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (r->shm_ring > 0) {
    sf_error e;
    if (sf_shm_ring_new((size_t)r->shm_ring, &r->rings[index], &fd, &e) < 0) {
      sf_log(SF_LOG_WARNING, sf_node_name(r->node), "%s; local worker %d sends its results through the socket",
             e.message, index);
    } else {
      posix_spawn_file_actions_adddup2(&actions, fd, fd); /* same number: clears close-on-exec in the child */
      snprintf(shm_fd, sizeof shm_fd, "%d", fd);
      argv[argc++] = (char *)"--shm-fd";
      argv[argc++] = shm_fd;
    }
  }
  pid_t pid;
  int rc = strchr(exe, '/') ? posix_spawn(&pid, exe, &actions, NULL, argv, environ)
                            : posix_spawnp(&pid, exe, &actions, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  for (int i = 0; i < n_plugins; i++) free(owned[i]);
  free(owned);
  free(argv);
  if (fd >= 0) close(fd);
  if (rc != 0)
    return sf_error_set(error, SF_ENOENT, SF_AT(.stage = sf_node_name(r->node)),
                        "cannot start worker process '%s': %s; set the group's worker_command or SHARDFLOW_BIN to the "
                        "shardflow executable",
                        exe, strerror(rc));
  r->children[index] = pid;
  return 0;
}

static void describe_exit(int status, char *out, size_t size) {
  if (WIFSIGNALED(status)) snprintf(out, size, "was killed by signal %d", WTERMSIG(status));
  else snprintf(out, size, "exited with status %d", WEXITSTATUS(status));
}

/*
 * The last local worker ended for good.  With no listen: endpoint no other worker can ever join, so the
 * run fails now rather than wait for ever (worker_timeout 0) with work left.
 */
static void no_local_worker_left(sf_head *r, const char *how) {
  if (r->listen[0]) return;
  for (int i = 0; i < r->n_children; i++)
    if (r->children[i] > 0) return;
  pthread_mutex_lock(&r->lock);
  bool work_left = !r->input_done || r->units->count > 0 || r->n_open > 0;
  if (work_left) {
    sf_error e;
    sf_error_set(&e, SF_EIO, SF_AT(.stage = sf_node_name(r->node)),
                 "every local worker process ended and none is restarted after %d restarts (the last %s), and "
                 "without `listen:` no other worker can join: see the workers' messages above; check the group's "
                 "worker_command (or SHARDFLOW_BIN) runs `shardflow worker`",
                 r->respawns, how);
    sf_head_fail(r, &e);
  }
  pthread_mutex_unlock(&r->lock);
}

void sf_head_reap_children(sf_head *r) {
  for (int i = 0; i < r->n_children; i++) {
    if (r->children[i] <= 0) continue;
    int status;
    pid_t p = waitpid(r->children[i], &status, WNOHANG);
    if (p != r->children[i]) continue;
    r->children[i] = 0;
    if (atomic_load(&r->stop)) continue;
    char how[64];
    describe_exit(status, how, sizeof how);
    if (r->respawns >= 3 * r->n_children) {
      sf_log(SF_LOG_WARNING, sf_node_name(r->node), "local worker %d %s and is not restarted (%d restarts used)", i, how, r->respawns);
      no_local_worker_left(r, how);
      continue;
    }
    r->respawns++;
    sf_log(SF_LOG_WARNING, sf_node_name(r->node), "local worker %d %s; starting another", i, how);
    sf_error e;
    if (sf_head_spawn_worker(r, i, &e) < 0) {
      sf_log(SF_LOG_WARNING, sf_node_name(r->node), "%s", e.message);
      no_local_worker_left(r, how);
    }
  }
}
