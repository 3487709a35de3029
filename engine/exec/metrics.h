/* The /metrics endpoint: a pipeline's counters in Prometheus' text exposition format 0.0.4, served with libmicrohttpd. */
#ifndef SF_ENGINE_METRICS_H
#define SF_ENGINE_METRICS_H

#include "node.h"
#include "shardflow/shardflow.h"
#include "strbuf.h"

typedef struct sf_metrics_server sf_metrics_server;

/*
 * Appends the metrics of a pipeline to out in the text exposition format 0.0.4
 * (https://prometheus.io/docs/instrumenting/exposition_formats/; names and meanings in
 * docs/metrics.md): one HELP and TYPE line per family, then one sample per stage replica
 * (nodes[0..n), every replica, borrowed), group or reader; then the pipeline's error records
 * (errors) and the seconds the trainer waited (trainer_wait).  Reads atomics and takes queue
 * locks briefly: it never blocks a step.  Returns 0 or SF_ENOMEM (out is then failed).
 */
int sf_metrics_format(sf_node *const *nodes, int n, uint64_t errors, double trainer_wait, sf_strbuf *out);

/*
 * What a scrape answers: appends the metrics to out (sf_metrics_format, with what the caller holds) and
 * returns 0 or SF_ENOMEM.  Called on the server's thread, while the pipeline runs.  The pipeline gives it,
 * so that this file never calls the pipeline's.
 */
typedef int (*sf_metrics_text)(void *opaque, sf_strbuf *out);

/*
 * Serves GET /metrics, the text of text(opaque, ...), on address "HOST:PORT" (HOST a name or a numeric IPv4/IPv6
 * address, [::1] style allowed; "PORT" or ":PORT" alone is 127.0.0.1:PORT, this host only; PORT 0
 * picks a free port, logged at info level and returned by sf_metrics_server_port) from
 * libmicrohttpd's own thread, with epoll or poll (any descriptor number), at most
 * min(64, RLIMIT_NOFILE / 16) connections at once (more wait in the kernel's backlog, holding no
 * descriptor of the process) and a 10 s idle timeout each.  Returns 0 with *server owned by the
 * caller (sf_metrics_server_destroy before what opaque points to goes: the pipeline's nodes); SF_EOPTION for an address
 * that does not parse or resolve, SF_EIO when the server cannot start (the message says why: the
 * port in use, not this host's address, a privileged port, the descriptor limit), both with a
 * message naming the `metrics` setting; SF_ENOMEM.
 */
int sf_metrics_server_new(sf_metrics_server **server, sf_metrics_text text, void *opaque, const char *address,
                          sf_error *error);

/* The TCP port the server listens on. */
int sf_metrics_server_port(const sf_metrics_server *server);

/* Stops the server (waits for a request in progress) and frees it; sets *server to NULL. NULL-safe. */
void sf_metrics_server_destroy(sf_metrics_server **server);

#endif
