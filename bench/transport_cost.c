/*
 * The transport's own cost: two processes (fork) exchange batch-sized RESULT messages through the wire
 * layer (sf_wire_send / sf_wire_recv, zero-copy payload frames) over ipc://, tcp:// and tcp:// with
 * CURVE, against a memcpy of the same bytes in the same run.  Prints bytes/s, messages/s and the CPU
 * both processes spent per GB moved.
 *   bench/transport_cost [--gib N] [--reps N] [--tmp DIR]
 * --gib: GiB each row moves (default 1); --reps: runs of each row, the median is shown (default 3);
 * --tmp: where the ipc socket and key files go (default $TMPDIR or /tmp).
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "transport.h"
#include "wire.h"
#include "shardflow/sample.h"

/* A message shape: n_samples samples of one float32 field of `shape`. */
typedef struct msg_case {
  const char *name;
  int n_samples;
  int ndim;
  int64_t shape[4];
} msg_case;

static const msg_case cases[] = {
    {"batch 64x3x224x224 f32", 64, 3, {3, 224, 224}},   /* 38.5 MB in 64 frames of 602 kB */
    {"batch as 1 frame", 1, 4, {64, 3, 224, 224}},
    {"1 MiB (1 frame)", 1, 1, {262144}},
};

typedef struct transport_kind {
  const char *name;
  bool tcp, curve;
} transport_kind;

static const transport_kind kinds[] = {
    {"ipc://", false, false},
    {"tcp:// plain", true, false},
    {"tcp:// CURVE", true, true},
};

typedef struct result {
  double seconds;     /* wall time of the timed messages at the receiver */
  double cpu_seconds; /* user+system of both processes over the whole exchange (connection included) */
  int messages;
} result;

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_of(const struct rusage *u) {
  return (double)u->ru_utime.tv_sec + (double)u->ru_utime.tv_usec * 1e-6 + (double)u->ru_stime.tv_sec +
         (double)u->ru_stime.tv_usec * 1e-6;
}

static double self_cpu(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return cpu_of(&u);
}

static size_t case_bytes(const msg_case *c) {
  size_t n = sizeof(float);
  for (int d = 0; d < c->ndim; d++) n *= (size_t)c->shape[d];
  return n * (size_t)c->n_samples;
}

/* A stuck peer ends the benchmark with an error instead of a hang. */
static void set_timeout(void *socket) {
  int ms = 60000;
  zmq_setsockopt(socket, ZMQ_RCVTIMEO, &ms, sizeof ms);
  zmq_setsockopt(socket, ZMQ_SNDTIMEO, &ms, sizeof ms);
}

static void die(const char *what, const sf_error *e) {
  fprintf(stderr, "transport_cost: %s: %s\n", what, e ? e->message : strerror(errno));
  exit(1);
}

/*
 * The sender (a worker's role): connects a DEALER, says HELLO, waits for the receiver's WELCOME, then
 * sends `total` RESULT messages whose payload frames are the same buffers every time (sf_wire_send
 * holds a reference until libzmq has sent each frame), and waits for BYE.  Exits the process.
 */
static void run_sender(const char *endpoint, const char *key_dir, const transport_kind *k, const msg_case *c,
                       int total) {
  void *ctx = zmq_ctx_new();
  char key[512], server[512];
  snprintf(key, sizeof key, "%s/sender.key", key_dir);
  snprintf(server, sizeof server, "%s/receiver.pub", key_dir);
  sf_transport_options o = {.endpoint = endpoint,
                            .secret_key_file = k->curve ? key : NULL,
                            .server_key_file = k->curve ? server : NULL,
                            .plaintext = k->tcp && !k->curve,
                            .message_bytes = (int64_t)case_bytes(c)};
  sf_transport *t = NULL;
  sf_error e;
  if (sf_transport_connect(ctx, &o, &t, &e) < 0) die("connect", &e);
  void *s = sf_transport_socket(t);
  set_timeout(s);
  sf_wire_message hello = {.type = SF_WIRE_HELLO, .text = "transport_cost", .pid = getpid(), .threads = 1};
  if (sf_wire_send(s, &hello, 0, &e) < 0) die("send HELLO", &e);
  sf_wire_message m;
  if (sf_wire_recv(s, false, &m, 0, &e) < 0 || m.type != SF_WIRE_WELCOME) die("receive WELCOME", &e);
  sf_wire_message_clear(&m);

  sf_sample **samples = calloc((size_t)c->n_samples, sizeof *samples);
  if (!samples) die("out of memory", NULL);
  for (int i = 0; i < c->n_samples; i++) {
    sf_tensor tensor = {0};
    if (!(samples[i] = sf_sample_new()) || sf_tensor_alloc(&tensor, SF_DTYPE_FLOAT32, c->ndim, c->shape) < 0)
      die("out of memory", NULL);
    memset(sf_tensor_data(&tensor), i + 1, sf_tensor_nbytes(&tensor)); /* touched: no page faults while timed */
    char name[16];
    snprintf(name, sizeof name, "%07d", i);
    if (sf_sample_set_key(samples[i], name, strlen(name)) < 0) die("out of memory", NULL);
    samples[i]->index = (uint64_t)i;
    if (!sf_sample_add_field(samples[i], "img", false, &tensor)) die("sf_sample_add_field", NULL);
  }
  for (int n = 0; n < total; n++) {
    sf_wire_message r = {.type = SF_WIRE_RESULT, .unit = (uint64_t)n, .samples = samples,
                         .n_samples = c->n_samples, .samples_in = (uint64_t)c->n_samples};
    if (sf_wire_send(s, &r, 0, &e) < 0) die("send RESULT", &e);
  }
  if (sf_wire_recv(s, false, &m, 0, &e) < 0 || m.type != SF_WIRE_BYE) die("receive BYE", &e);
  sf_wire_message_clear(&m);
  for (int i = 0; i < c->n_samples; i++) sf_sample_destroy(&samples[i]);
  free(samples);
  sf_transport_close(&t);
  zmq_ctx_term(ctx);
  _exit(0);
}

/* The receiver (the head's role): a ROUTER; times `total - warmup` messages after the first `warmup`. */
static result run_pair(const char *tmp, const transport_kind *k, const msg_case *c, int total, int warmup) {
  char endpoint[512], key_dir[400], key[512], allowed[512];
  snprintf(key_dir, sizeof key_dir, "%s", tmp);
  if (k->tcp) snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:0");
  else {
    snprintf(endpoint, sizeof endpoint, "ipc://%s/transport-cost.ipc", tmp);
    unlink(endpoint + 6);
  }
  snprintf(key, sizeof key, "%s/receiver.key", key_dir);
  snprintf(allowed, sizeof allowed, "%s/sender.pub", key_dir);

  void *ctx = zmq_ctx_new();
  sf_transport_options o = {.endpoint = endpoint,
                            .secret_key_file = k->curve ? key : NULL,
                            .allowed_keys = k->curve ? allowed : NULL,
                            .plaintext = k->tcp && !k->curve,
                            .max_message_bytes = (int64_t)case_bytes(c) + 65536,
                            .message_bytes = (int64_t)case_bytes(c)};
  sf_transport *t = NULL;
  sf_error e;
  if (sf_transport_listen(ctx, &o, &t, &e) < 0) die("listen", &e);
  char bound[512];
  snprintf(bound, sizeof bound, "%s", sf_transport_endpoint(t));
  double cpu0 = self_cpu();
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork", NULL);
  if (pid == 0) {
    /* a fresh context in the child: a zmq context does not survive fork */
    run_sender(bound, key_dir, k, c, total);
  }
  void *s = sf_transport_socket(t);
  set_timeout(s);
  sf_wire_message m;
  if (sf_wire_recv(s, true, &m, 0, &e) < 0 || m.type != SF_WIRE_HELLO) die("receive HELLO", &e);
  sf_wire_peer peer = m.peer;
  sf_wire_message_clear(&m);
  sf_wire_message welcome = {.type = SF_WIRE_WELCOME, .peer = peer, .text = "", .world_size = 1};
  if (sf_wire_send(s, &welcome, 0, &e) < 0) die("send WELCOME", &e);
  double t0 = 0;
  size_t expect = case_bytes(c);
  for (int n = 0; n < total; n++) {
    if (n == warmup) t0 = now_seconds();
    if (sf_wire_recv(s, true, &m, 0, &e) < 0) die("receive RESULT", &e);
    size_t got = 0;
    for (int i = 0; i < m.n_samples; i++) got += sf_tensor_nbytes(&m.samples[i]->fields[0].tensor);
    if (m.type != SF_WIRE_RESULT || got != expect || m.unit != (uint64_t)n) {
      fprintf(stderr, "transport_cost: message %d: type %s, %zu bytes, unit %llu (expected RESULT, %zu, %d)\n", n,
              sf_wire_type_name(m.type), got, (unsigned long long)m.unit, expect, n);
      exit(1);
    }
    sf_wire_message_clear(&m);
  }
  double t1 = now_seconds();
  sf_wire_message bye = {.type = SF_WIRE_BYE, .peer = peer, .text = "done"};
  if (sf_wire_send(s, &bye, 0, &e) < 0) die("send BYE", &e);
  int status = 0;
  struct rusage child;
  if (wait4(pid, &status, 0, &child) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "transport_cost: the sending process failed (%s)\n", endpoint);
    exit(1);
  }
  sf_transport_close(&t);
  zmq_ctx_term(ctx);
  return (result){.seconds = t1 - t0, .cpu_seconds = self_cpu() - cpu0 + cpu_of(&child), .messages = total - warmup};
}

/*
 * memcpy of the same bytes, frame by frame, through 256 MiB of distinct source and destination memory
 * (as the transport's bytes: never cache-resident): into warm destination pages, and into a fresh
 * malloc per frame (what a receiver that allocates each frame pays, page faults included).
 */
static void run_memcpy(const msg_case *c, int messages, double *warm, double *fresh) {
  size_t frame = case_bytes(c) / (size_t)c->n_samples;
  size_t pool = (size_t)256 << 20;
  if (pool < 2 * frame) pool = 2 * frame;
  size_t slots = pool / frame;
  uint8_t *src = malloc(slots * frame), *dst = malloc(slots * frame);
  if (!src || !dst) die("out of memory", NULL);
  memset(src, 7, slots * frame);
  memset(dst, 0, slots * frame);
  size_t k = 0;
  double t0 = now_seconds();
  for (int n = 0; n < messages; n++)
    for (int p = 0; p < c->n_samples; p++, k++) {
      memcpy(dst + (k % slots) * frame, src + ((k * 7 + 3) % slots) * frame, frame);
      __asm__ volatile("" : : "r"(dst) : "memory");
    }
  *warm = now_seconds() - t0;
  k = 0;
  t0 = now_seconds();
  for (int n = 0; n < messages; n++) {
    uint8_t *frames[64];
    int held = 0;
    for (int p = 0; p < c->n_samples; p++, k++) {
      uint8_t *d = malloc(frame);
      if (!d) die("out of memory", NULL);
      memcpy(d, src + ((k * 7 + 3) % slots) * frame, frame);
      __asm__ volatile("" : : "r"(d) : "memory");
      if (held == 64) free(frames[--held]);
      frames[held++] = d; /* a message's frames live together, as at the receiver */
    }
    while (held) free(frames[--held]);
  }
  *fresh = now_seconds() - t0;
  free(src);
  free(dst);
}

/* CURVE key pairs for both sides; pairs the key loader does not read back are made again. */
static void make_keys(const char *dir) {
  static const char *const names[] = {"receiver", "sender"};
  for (int i = 0; i < 2; i++) {
    for (int attempt = 0;; attempt++) {
      char path[512], pub[SF_CURVE_KEY_Z85_LEN + 1], sec[SF_CURVE_KEY_Z85_LEN + 1];
      sf_error e;
      snprintf(path, sizeof path, "%s/%s.key", dir, names[i]);
      unlink(path);
      snprintf(path, sizeof path, "%s/%s.pub", dir, names[i]);
      unlink(path);
      if (sf_curve_keygen(dir, names[i], NULL, &e) < 0) die("keygen", &e);
      snprintf(path, sizeof path, "%s/%s.key", dir, names[i]);
      int rc = sf_curve_key_load(path, pub, sec, &e);
      snprintf(path, sizeof path, "%s/%s.pub", dir, names[i]);
      if (rc == 0) rc = sf_curve_key_load(path, pub, NULL, &e);
      if (rc == 0) break;
      if (attempt == 50) die("key files", &e);
    }
  }
}

enum { MAX_REPS = 15 };

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void print_rate(const char *name, double bytes, double seconds, int messages, double cpu, double ref) {
  printf("  %-26s %9.2f GB/s %11.1f msg/s %9.2f %9.3f\n", name, bytes / seconds / 1e9, messages / seconds,
         cpu >= 0 ? cpu / (bytes / 1e9) : 0.0, ref / (bytes / seconds));
}

int main(int argc, char **argv) {
  double gib = 1;
  int reps = 3;
  const char *tmp_parent = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--gib") == 0 && i + 1 < argc) gib = atof(argv[++i]);
    else if (strcmp(argv[i], "--tmp") == 0 && i + 1 < argc) tmp_parent = argv[++i];
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: transport_cost [--gib N] [--reps N] [--tmp DIR]\n");
      return 2;
    }
  }
  if (!(gib > 0)) gib = 2;
  if (reps < 1) reps = 1;
  if (reps > MAX_REPS) reps = MAX_REPS;
  char tmp[400];
  snprintf(tmp, sizeof tmp, "%s/transport-cost-XXXXXX", tmp_parent);
  if (!mkdtemp(tmp)) die(tmp, NULL);
  make_keys(tmp);
  signal(SIGPIPE, SIG_IGN);

  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  printf("wire-layer RESULT messages between two processes (sf_wire_send -> sf_wire_recv, zero-copy frames),\n"
         "%.2f GiB per row, medians of %d runs, %ld CPUs; CPU s/GB counts both processes;\n"
         "'memcpy/x' = the warm memcpy's bytes/s over the row's\n",
         gib, reps, cpus);
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const msg_case *c = &cases[ci];
    double bytes_per = (double)case_bytes(c);
    int total = (int)(gib * 1073741824.0 / bytes_per);
    if (total < 20) total = 20;
    int warmup = total / 10 > 2 ? total / 10 : 2;
    int timed = total - warmup;
    double warm_s[MAX_REPS], fresh_s[MAX_REPS];
    for (int rep = 0; rep < reps; rep++) run_memcpy(c, timed, &warm_s[rep], &fresh_s[rep]);
    double warm = median(warm_s, reps), fresh = median(fresh_s, reps);
    double ref = bytes_per * timed / warm;
    printf("\n%s: %.2f MB a message, %d frame%s of %.0f kB; %d messages timed\n", c->name, bytes_per / 1e6,
           c->n_samples, c->n_samples == 1 ? "" : "s", bytes_per / c->n_samples / 1e3, timed);
    printf("  %-26s %12s %15s %9s %9s\n", "", "bytes/s", "messages/s", "CPU s/GB", "memcpy/x");
    print_rate("memcpy (warm destination)", bytes_per * timed, warm, timed, warm, ref);
    print_rate("memcpy (malloc'd each time)", bytes_per * timed, fresh, timed, fresh, ref);
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
      double secs[MAX_REPS], cpu[MAX_REPS];
      result r = {0};
      for (int rep = 0; rep < reps; rep++) {
        r = run_pair(tmp, &kinds[ki], c, total, warmup);
        secs[rep] = r.seconds;
        cpu[rep] = r.cpu_seconds;
      }
      r.seconds = median(secs, reps);
      r.cpu_seconds = median(cpu, reps);
      double moved = bytes_per * r.messages;
      /* CPU is measured over all `total` messages (connection and warm-up too): scale it to the timed bytes */
      print_rate(kinds[ki].name, moved, r.seconds, r.messages, r.cpu_seconds * timed / total, ref);
    }
  }
  char path[512];
  static const char *const files[] = {"receiver.key", "receiver.pub", "sender.key", "sender.pub", "transport-cost.ipc"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", tmp, files[i]);
    unlink(path);
  }
  rmdir(tmp);
  return 0;
}
