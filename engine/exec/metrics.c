/* The /metrics endpoint: a pipeline's counters in Prometheus' text format 0.0.4, served by libmicrohttpd's thread. */
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "log.h"
#include "metrics.h"
#include "node.h"

struct sf_metrics_server {
  struct MHD_Daemon *daemon;
  sf_pipeline *pipeline;
  int port;
};

/* One metric family: its name, type and help (the format's HELP/TYPE lines). */
typedef struct family {
  const char *name, *type, *help;
} family;

static void header(sf_strbuf *out, const family *f) {
  sf_strbuf_appendf(out, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, f->type);
}

/* Node and stage names are [A-Za-z0-9_-] (graph files), so label values need no escaping. */
static void node_sample(sf_strbuf *out, const family *f, const sf_node *n, double value) {
  sf_strbuf_appendf(out, "%s{stage=\"%s\",type=\"%s\",replica=\"%d\"} %.10g\n", f->name, n->name, n->def->name,
                    n->replica, value);
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

static bool extra_value(int f, const sf_node_extra *x, double *v) {
  const uint64_t group[] = {x->workers, x->reassigned, x->duplicates};
  const uint64_t reader[] = {x->downloaded_bytes, x->refetched_bytes, x->retries, x->cache_hits};
  if (f <= X_DUPLICATES) {
    *v = (double)group[f];
    return x->group;
  }
  *v = (double)reader[f - X_DOWNLOADED];
  return x->reader;
}

int sf_metrics_format(sf_pipeline *p, sf_strbuf *out) {
  int n;
  sf_node *const *nodes = sf_pipeline_nodes(p, &n);
  for (int f = 0; f < F_NODE_END; f++) {
    header(out, &node_families[f]);
    for (int i = 0; i < n; i++) node_sample(out, &node_families[f], nodes[i], node_value(f, nodes[i]));
  }
  sf_node_extra *extras = calloc((size_t)n + 1, sizeof *extras);
  if (!extras) {
    out->failed = true;
    return SF_ENOMEM;
  }
  for (int i = 0; i < n; i++)
    if (nodes[i]->extra) nodes[i]->extra(nodes[i], &extras[i]);
  for (int f = 0; f < X_END; f++) {
    header(out, &extra_families[f]);
    for (int i = 0; i < n; i++) {
      double v;
      if (extra_value(f, &extras[i], &v)) node_sample(out, &extra_families[f], nodes[i], v);
    }
  }
  free(extras);
  static const family errors = {"shardflow_pipeline_errors_total", "counter", "Error records of the whole pipeline."};
  header(out, &errors);
  sf_strbuf_appendf(out, "%s %llu\n", errors.name, (unsigned long long)sf_pipeline_error_count(p));
  static const family wait = {"shardflow_trainer_wait_seconds_total", "counter",
                              "Seconds the trainer waited for a batch inside sf_pipeline_next()."};
  header(out, &wait);
  return sf_strbuf_appendf(out, "%s %.10g\n", wait.name, sf_pipeline_trainer_wait(p));
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size,
                              void **request_state) {
  sf_metrics_server *s = cls;
  struct MHD_Response *response;
  unsigned int status = MHD_HTTP_OK;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    static const char text[] = "only GET /metrics\n";
    response = MHD_create_response_from_buffer(sizeof text - 1, (void *)text, MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_METHOD_NOT_ALLOWED;
  } else if (strcmp(url, "/metrics") != 0) {
    static const char text[] = "shardflow serves /metrics only\n";
    response = MHD_create_response_from_buffer(sizeof text - 1, (void *)text, MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_NOT_FOUND;
  } else {
    sf_strbuf b = {0};
    sf_metrics_format(s->pipeline, &b);
    size_t len;
    char *text = sf_strbuf_take(&b, &len);
    if (!text) return MHD_NO; /* out of memory: drop the connection */
    response = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (response) MHD_add_response_header(response, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  }
  if (!response) return MHD_NO;
  enum MHD_Result r = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return r;
}

/* Splits "HOST:PORT" or "[V6]:PORT" and resolves HOST. Returns 0 with *ai (freeaddrinfo) or SF_EOPTION. */
static int resolve(const char *address, struct addrinfo **ai, sf_error *error) {
  char host[256];
  const char *colon = strrchr(address, ':');
  const char *h = address;
  size_t len = colon ? (size_t)(colon - address) : 0;
  if (len >= 2 && h[0] == '[' && h[len - 1] == ']') h++, len -= 2;
  char *end;
  long port = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!colon || len == 0 || len >= sizeof host || colon[1] == '\0' || *end || port < 0 || port > 65535)
    return sf_error_set(error, SF_EOPTION, SF_AT(),
                        "metrics: '%s' is not HOST:PORT (e.g. 127.0.0.1:9108; port 0 picks a free one)", address);
  memcpy(host, h, len);
  host[len] = '\0';
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  int rc = getaddrinfo(host, colon + 1, &hints, ai);
  if (rc != 0)
    return sf_error_set(error, SF_EOPTION, SF_AT(), "metrics: cannot resolve host '%s' of '%s': %s", host, address,
                        gai_strerror(rc));
  return 0;
}

int sf_metrics_server_new(sf_metrics_server **server, sf_pipeline *p, const char *address, sf_error *error) {
  *server = NULL;
  struct addrinfo *ai;
  int r = resolve(address, &ai, error);
  if (r < 0) return r;
  sf_metrics_server *s = calloc(1, sizeof *s);
  if (!s) {
    freeaddrinfo(ai);
    return sf_error_set(error, SF_ENOMEM, SF_AT(), "out of memory");
  }
  s->pipeline = p;
  unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, answer, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                               MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!s->daemon) {
    free(s);
    return sf_error_set(error, SF_EIO, SF_AT(),
                        "metrics: cannot listen on %s (in use, or not this host's address?): give another port, or "
                        "port 0 for a free one", address);
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = info ? (int)info->port : 0;
  sf_log(SF_LOG_INFO, NULL, "serving metrics on http://%.*s:%d/metrics", (int)(strrchr(address, ':') - address),
         address, s->port);
  *server = s;
  return 0;
}

int sf_metrics_server_port(const sf_metrics_server *s) { return s->port; }

void sf_metrics_server_destroy(sf_metrics_server **server) {
  if (!server || !*server) return;
  MHD_stop_daemon((*server)->daemon);
  free(*server);
  *server = NULL;
}
