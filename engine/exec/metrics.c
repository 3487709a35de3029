/* The /metrics endpoint: a pipeline's counters in Prometheus' text format 0.0.4, served by libmicrohttpd's thread. */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dynlib.h"
#include "files.h"
#include "log.h"
#include "metrics.h"

/*
 * libmicrohttpd is opened when a pipeline first serves metrics (engine/core/dynlib.h), not linked: with GnuTLS
 * and the rest it brings, it was 3 ms of every CLI process's start, metrics or not. Its functions go
 * through this table.
 */
#define MHD_FUNCTIONS(X) X(MHD_start_daemon) X(MHD_stop_daemon) X(MHD_get_daemon_info) \
  X(MHD_create_response_from_buffer) X(MHD_add_response_header) X(MHD_queue_response) X(MHD_destroy_response)
static struct { MHD_FUNCTIONS(SF_DYNLIB_FIELD) } mhd;
static const char *const mhd_symbols[] = {MHD_FUNCTIONS(SF_DYNLIB_NAME) NULL};
static sf_dynlib mhd_lib = {.soname = SF_MICROHTTPD_SONAME, .symbols = mhd_symbols, .fns = &mhd,
                            .purpose = "serve /metrics (libmicrohttpd; Debian: libmicrohttpd12)"};

struct sf_metrics_server {
  struct MHD_Daemon *daemon;
  sf_metrics_text text;
  void *opaque;
  int port;
  pthread_t starter;          /* the thread in MHD_start_daemon */
  atomic_bool started;        /* MHD_start_daemon returned: its messages go to the log, rate-limited */
  char start_said[256];       /* libmicrohttpd's last message while starting (the starter's only) */
  atomic_llong last_warning;  /* CLOCK_MONOTONIC seconds of the last message logged */
};

/* One metric family: its name, type and help (the format's HELP/TYPE lines). */
typedef struct family {
  const char *name, *type, *help;
} family;

static void header(sf_strbuf *out, const family *f) {
  sf_strbuf_appendf(out, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, f->type);
}

/* Length of the well-formed UTF-8 sequence (RFC 3629) at s, or 0 when the byte there starts none. */
static int utf8_length(const unsigned char *s) {
  unsigned char c = s[0];
  int n = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  for (int i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) || (c == 0xf0 && s[1] < 0x90) ||
      (c == 0xf4 && s[1] > 0x8f))
    return 0; /* overlong, a surrogate, or beyond U+10FFFF */
  return n;
}

/*
 * Appends a label value as the text format wants it: backslash, double quote and newline escaped (\\, \",
 * \n), so that a name from a graph file cannot end its label or start a line (a series) of its own; and
 * valid UTF-8, so that one name cut at the node name's 31 bytes does not make Prometheus refuse the scrape
 * (a byte that starts no character becomes U+FFFD).
 */
static void label_value(sf_strbuf *out, const char *value) {
  for (const unsigned char *s = (const unsigned char *)value; *s;) {
    int n = utf8_length(s);
    if (*s == '\\' || *s == '"')
      sf_strbuf_appendf(out, "\\%c", *s);
    else if (*s == '\n')
      sf_strbuf_add(out, "\\n");
    else if (n > 0)
      sf_strbuf_append(out, s, (size_t)n);
    else
      sf_strbuf_add(out, "\xef\xbf\xbd");
    s += n > 0 ? n : 1;
  }
}

static void node_sample(sf_strbuf *out, const family *f, const sf_node *n, double value) {
  sf_strbuf_appendf(out, "%s{stage=\"", f->name);
  label_value(out, n->name);
  sf_strbuf_add(out, "\",type=\"");
  label_value(out, n->def->name);
  sf_strbuf_appendf(out, "\",replica=\"%d\"} %.10g\n", n->replica, value);
}

static size_t port_depth(const sf_port *port) {
  size_t d = 0;
  for (int i = 0; i < port->n; i++) d += sf_queue_depth(port->queues[i]);
  return d;
}

static size_t port_capacity(const sf_port *port) {
  size_t c = 0;
  for (int i = 0; i < port->n; i++) c += port->queues[i]->capacity;
  return c;
}

enum { F_ITEMS, F_BYTES, F_BUSY, F_WAIT, F_ERRORS, F_SKIPPED, F_QIN, F_QOUT, F_QCAP, F_NODE_END };

static const family node_families[F_NODE_END] = {
    [F_ITEMS] = {"shardflow_stage_items_total", "counter", "Items (shards, samples or batches) the stage produced."},
    [F_BYTES] = {"shardflow_stage_bytes_total", "counter", "Payload bytes the stage produced."},
    [F_BUSY] = {"shardflow_stage_busy_seconds_total", "counter", "Wall-clock seconds inside the stage's step()."},
    [F_WAIT] = {"shardflow_stage_wait_seconds_total", "counter", "Wall-clock seconds the stage waited for input."},
    [F_ERRORS] = {"shardflow_stage_errors_total", "counter", "Error records the stage raised."},
    [F_SKIPPED] = {"shardflow_stage_skipped_total", "counter", "Samples the stage dropped under the skip policy."},
    [F_QIN] = {"shardflow_stage_input_queue_items", "gauge", "Items waiting in the stage's input queue(s)."},
    [F_QOUT] = {"shardflow_stage_output_queue_items", "gauge",
                "Items the stage produced that its consumer (the next stage, or the trainer) has not taken."},
    [F_QCAP] = {"shardflow_stage_output_queue_capacity_items", "gauge", "Items the stage's output queue(s) hold at most."},
};

static double node_value(int f, sf_node *n) {
  switch (f) {
  case F_ITEMS: return (double)atomic_load(&n->items);
  case F_BYTES: return (double)atomic_load(&n->bytes);
  case F_BUSY: return (double)(atomic_load(&n->busy_ns) + sf_node_deferred_ns(n)) * 1e-9;
  case F_WAIT: return (double)atomic_load(&n->wait_ns) * 1e-9;
  case F_ERRORS: return (double)atomic_load(&n->errors);
  case F_SKIPPED: return (double)atomic_load(&n->skipped);
  case F_QIN: return (double)port_depth(&n->in);
  case F_QOUT: return (double)port_depth(&n->out);
  default: return (double)port_capacity(&n->out);
  }
}

enum { X_WORKERS, X_REASSIGNED, X_DUPLICATES, X_DOWNLOADED, X_REFETCHED, X_RETRIES, X_CACHE_HITS, X_END };

static const family extra_families[X_END] = {
    [X_WORKERS] = {"shardflow_group_workers", "gauge", "Decode workers alive now in the group."},
    [X_REASSIGNED] = {"shardflow_group_units_reassigned_total", "counter",
                      "Work units handed to another worker after theirs died, left or was late."},
    [X_DUPLICATES] = {"shardflow_group_duplicates_total", "counter",
                      "Results dropped because their unit was already done."},
    [X_DOWNLOADED] = {"shardflow_reader_downloaded_bytes_total", "counter", "Shard bytes received over the network."},
    [X_REFETCHED] = {"shardflow_reader_refetched_bytes_total", "counter",
                     "Shard bytes received a second time (after a retry) and discarded."},
    [X_RETRIES] = {"shardflow_reader_retries_total", "counter", "Download attempts made after a failure."},
    [X_CACHE_HITS] = {"shardflow_reader_cache_hits_total", "counter", "Shards served from the shard cache."},
};

static bool extra_value(int f, const sf_stage_stats *x, double *v) {
  const uint64_t group[] = {x->workers, x->reassigned, x->duplicates};
  const uint64_t reader[] = {x->downloaded_bytes, x->refetched_bytes, x->retries, x->cache_hits};
  if (f <= X_DUPLICATES) {
    *v = (double)group[f];
    return x->group;
  }
  *v = (double)reader[f - X_DOWNLOADED];
  return x->reader;
}

int sf_metrics_format(sf_node *const *nodes, int n, uint64_t error_count, double trainer_wait, sf_strbuf *out) {
  for (int f = 0; f < F_NODE_END; f++) {
    header(out, &node_families[f]);
    for (int i = 0; i < n; i++) node_sample(out, &node_families[f], nodes[i], node_value(f, nodes[i]));
  }
  /* What each replica's stage reports of its own (its stats callback): groups, readers, tuned options. */
  sf_stage_stats *extras = calloc((size_t)n + 1, sizeof *extras);
  if (!extras) {
    out->failed = true;
    return SF_ENOMEM;
  }
  for (int i = 0; i < n; i++)
    if (nodes[i]->def->stats) nodes[i]->def->stats(nodes[i], &extras[i], NULL, 0);
  for (int f = 0; f < X_END; f++) {
    header(out, &extra_families[f]);
    for (int i = 0; i < n; i++) {
      double v;
      if (extra_value(f, &extras[i], &v)) node_sample(out, &extra_families[f], nodes[i], v);
    }
  }
  /* What the stages tune while running (tar_split's prefetch): one series per node and option. */
  static const family tuned_families[2] = {
      {"shardflow_stage_tuned_value", "gauge",
       "An option's value in force now, as the stage's tuner chose it (or as written, when written)."},
      {"shardflow_stage_tuned_changes_total", "counter", "Times the stage's tuner changed the option."},
  };
  for (int f = 0; f < 2; f++) {
    header(out, &tuned_families[f]);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < extras[i].n_tuned && j < SF_STAGE_TUNED_MAX; j++) {
        const sf_stage_tuned *u = &extras[i].tuned[j];
        sf_strbuf_appendf(out, "%s{stage=\"", tuned_families[f].name);
        label_value(out, nodes[i]->name);
        sf_strbuf_add(out, "\",type=\"");
        label_value(out, nodes[i]->def->name);
        sf_strbuf_appendf(out, "\",replica=\"%d\",option=\"", nodes[i]->replica);
        label_value(out, u->option);
        sf_strbuf_appendf(out, "\"} %.10g\n", f == 0 ? (double)u->value : (double)u->changes);
      }
  }
  free(extras);
  /* The stages' own counters: one family, the counter's name a label (names are checked: a-z, 0-9, _). */
  static const family counter = {"shardflow_stage_counter_total", "counter",
                                 "A count a stage keeps of its own (sf_node_counter_add), by its name."};
  header(out, &counter);
  for (int i = 0; i < n; i++) {
    int k = atomic_load_explicit(&nodes[i]->n_counters, memory_order_acquire);
    for (int c = 0; c < k; c++) {
      sf_strbuf_add(out, "shardflow_stage_counter_total{stage=\"");
      label_value(out, nodes[i]->name);
      sf_strbuf_add(out, "\",type=\"");
      label_value(out, nodes[i]->def->name);
      sf_strbuf_appendf(out, "\",replica=\"%d\",counter=\"%s\"} %llu\n", nodes[i]->replica, nodes[i]->counter_names[c],
                        (unsigned long long)atomic_load_explicit(&nodes[i]->counters[c], memory_order_relaxed));
    }
  }
  static const family errors = {"shardflow_pipeline_errors_total", "counter", "Error records of the whole pipeline."};
  header(out, &errors);
  sf_strbuf_appendf(out, "%s %llu\n", errors.name, (unsigned long long)error_count);
  static const family wait = {"shardflow_trainer_wait_seconds_total", "counter",
                              "Seconds the trainer waited for a batch inside sf_pipeline_next()."};
  header(out, &wait);
  return sf_strbuf_appendf(out, "%s %.10g\n", wait.name, trainer_wait);
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size,
                              void **request_state) {
  sf_metrics_server *s = cls;
  struct MHD_Response *response;
  unsigned int status = MHD_HTTP_OK;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    static const char text[] = "only GET /metrics\n";
    response = mhd.MHD_create_response_from_buffer(sizeof text - 1, (void *)text, MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
  } else if (strcmp(url, "/metrics") != 0) {
    static const char text[] = "shardflow serves /metrics only\n";
    response = mhd.MHD_create_response_from_buffer(sizeof text - 1, (void *)text, MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_NOT_FOUND;
  } else {
    sf_strbuf b = {0};
    s->text(s->opaque, &b);
    size_t len;
    char *text = sf_strbuf_take(&b, &len);
    if (!text) return MHD_NO; /* out of memory: drop the connection */
    response = mhd.MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (response) mhd.MHD_add_response_header(response, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  }
  if (!response) return MHD_NO;
  enum MHD_Result r = mhd.MHD_queue_response(connection, status, response);
  mhd.MHD_destroy_response(response);
  return r;
}

/*
 * Splits "HOST:PORT", "[V6]:PORT", ":PORT" or "PORT" and resolves HOST; without a host it is 127.0.0.1, so
 * that /metrics reaches other hosts only when the user names an address. Returns 0 with *ai
 * (freeaddrinfo) and the host in host[size], or SF_EOPTION.
 */
static int resolve(const char *address, struct addrinfo **ai, char *host, size_t size, sf_error *error) {
  const char *colon = strrchr(address, ':');
  const char *h = address, *p = colon ? colon + 1 : address;
  size_t len = colon ? (size_t)(colon - address) : 0;
  if (len >= 2 && h[0] == '[' && h[len - 1] == ']') h++, len -= 2;
  char *end;
  long port = strtol(p, &end, 10);
  if (len >= size || *p < '0' || *p > '9' || *end || port < 0 || port > 65535)
    return sf_error_set(error, SF_EOPTION, SF_AT(),
                        "metrics: '%s' is not HOST:PORT (e.g. 127.0.0.1:9108; port 0 picks a free one)", address);
  if (len == 0) {
    snprintf(host, size, "127.0.0.1");
  } else {
    memcpy(host, h, len);
    host[len] = '\0';
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  int rc = getaddrinfo(host, p, &hints, ai);
  if (rc != 0)
    return sf_error_set(error, SF_EOPTION, SF_AT(), "metrics: cannot resolve host '%s' of '%s': %s", host, address,
                        gai_strerror(rc));
  return 0;
}

/* At most 64 connections, and no more than 1/16 of the descriptors the process may open (RLIMIT_NOFILE):
 * a client holding connections open must not take the descriptors shards, downloads and workers need. */
static unsigned connection_limit(void) {
  struct rlimit limit;
  rlim_t n = getrlimit(RLIMIT_NOFILE, &limit) == 0 ? limit.rlim_cur / 16 : 64;
  return n < 4 ? 4 : n > 64 ? 64 : (unsigned)n;
}

static double monotonic_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/*
 * libmicrohttpd's messages. While it starts, the last one is kept for the error (the real cause: a bind,
 * epoll or thread failure). Once it serves, they are warnings at most one a minute: a client holding
 * connections makes one per connection refused, and the log must not be its tool.
 */
static void on_mhd_message(void *cls, const char *fmt, va_list ap) {
  sf_metrics_server *s = cls;
  char text[256];
  vsnprintf(text, sizeof text, fmt, ap);
  size_t n = strlen(text);
  while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '.')) text[--n] = '\0';
  if (!atomic_load(&s->started) && pthread_equal(pthread_self(), s->starter)) {
    snprintf(s->start_said, sizeof s->start_said, "%s", text);
    return;
  }
  long long now = (long long)monotonic_seconds(), last = atomic_load(&s->last_warning);
  if (last != 0 && now - last < 60) return;
  if (!atomic_compare_exchange_strong(&s->last_warning, &last, now == 0 ? 1 : now)) return;
  sf_log(SF_LOG_WARNING, NULL, "metrics server: %s (further messages within a minute are not shown)", text);
}

/*
 * Why MHD_start_daemon failed: the bind tried again here for its errno, else what libmicrohttpd said.
 * Writes the cause and what to do into why[size].
 */
static void listen_failure(const struct addrinfo *ai, const char *host, int mhd_errno, const char *mhd_said, char *why,
                           size_t size) {
  int e = 0, fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    e = errno;
  } else {
    int one = 1; /* as libmicrohttpd binds */
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) e = errno;
    close(fd);
  }
  if (e == EADDRINUSE)
    snprintf(why, size, "the port is in use: give another port, or port 0 for a free one");
  else if (e == EADDRNOTAVAIL)
    snprintf(why, size, "%.200s is not an address of this host: use 127.0.0.1 (this host only) or the address of one "
             "of its interfaces", host);
  else if (e == EACCES)
    snprintf(why, size, "ports below 1024 need privileges: give a higher port, or port 0 for a free one");
  else if (sf_errno_is_fd_limit(e))
    sf_fd_limit_text(e, why, size);
  else if (e)
    snprintf(why, size, "%s", strerror(e));
  else if (sf_errno_is_fd_limit(mhd_errno))
    sf_fd_limit_text(mhd_errno, why, size);
  else
    snprintf(why, size, "libmicrohttpd: %s", mhd_said[0] ? mhd_said : "the server did not start");
}

int sf_metrics_server_new(sf_metrics_server **server, sf_metrics_text text, void *opaque, const char *address,
                          sf_error *error) {
  *server = NULL;
  if (sf_dynlib_load(&mhd_lib) < 0) return sf_error_set(error, SF_EUNSUPPORTED, SF_AT(), "metrics: %s", mhd_lib.why);
  struct addrinfo *ai;
  char host[256];
  int r = resolve(address, &ai, host, sizeof host, error);
  if (r < 0) return r;
  sf_metrics_server *s = calloc(1, sizeof *s);
  if (!s) {
    freeaddrinfo(ai);
    return sf_error_set(error, SF_ENOMEM, SF_AT(), "out of memory");
  }
  s->text = text;
  s->opaque = opaque;
  s->starter = pthread_self();
  /* epoll (or poll) where there is one, never select(): a trainer may hold descriptors above FD_SETSIZE.
   * An event fd to stop the thread: at the connection limit the listen socket is not watched, and shutting
   * it down (libmicrohttpd's way without one) would leave the stop waiting for the idle timeout. */
  unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG;
  if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  errno = 0;
  s->daemon = mhd.MHD_start_daemon(flags, 0, NULL, NULL, answer, s, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_message, s,
                               MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, connection_limit(),
                               MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
  if (!s->daemon) {
    int mhd_errno = errno;
    char why[512];
    listen_failure(ai, host, mhd_errno, s->start_said, why, sizeof why);
    freeaddrinfo(ai);
    free(s);
    return sf_error_set(error, SF_EIO, SF_AT(), "metrics: cannot listen on %s: %s", address, why);
  }
  freeaddrinfo(ai);
  atomic_store(&s->started, true);
  const union MHD_DaemonInfo *info = mhd.MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = info ? (int)info->port : 0;
  bool v6 = strchr(host, ':') != NULL;
  sf_log(SF_LOG_INFO, NULL, "serving metrics on http://%s%s%s:%d/metrics", v6 ? "[" : "", host, v6 ? "]" : "", s->port);
  *server = s;
  return 0;
}

int sf_metrics_server_port(const sf_metrics_server *s) { return s->port; }

void sf_metrics_server_destroy(sf_metrics_server **server) {
  if (!server || !*server) return;
  mhd.MHD_stop_daemon((*server)->daemon);
  free(*server);
  *server = NULL;
}
