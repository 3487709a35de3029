/*
 * ZeroMQ sockets between a head and its workers (engine/group/transport.h).
 *
 * A listening tcp:// transport is a CURVE server ROUTER whose clients are
 * admitted by our ZAP handler (engine/group/transport_zap.c) against an allow-list
 * of worker keys; key files are engine/group/transport_keys.c.  This file makes
 * the sockets and sets their limits.
 *
 * Fail closed: no allow-list (and no explicit plaintext) -> listen refuses to
 * start; the ZAP handler is bound before the ROUTER and stopped only after it
 * is closed (libzmq admits any CURVE client when no handler is bound).
 *
 * One CURVE listening transport per ZeroMQ context: the ZAP endpoint is one
 * per context.  A second one fails with SF_EINVAL (use another context).
 */
#include "log.h"
#include "transport.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "transport_zap.h"

struct sf_transport {
  void *socket;
  char endpoint[512];
  sf_zap *zap;        /* a CURVE server's authentication, else NULL */
};

/* ------------------------------------------------------------- sockets */

static int set_int(void *s, int option, int value, const char *name, const char *endpoint, sf_error *error) {
  if (zmq_setsockopt(s, option, &value, sizeof value) == 0) return 0;
  return sf_error_set(error, SF_ENET, SF_AT(.url = endpoint), "zmq_setsockopt %s: %s", name, zmq_strerror(errno));
}

/* Limits shared by both ends: message size, byte-budget HWMs, linger, handshake timeout, keepalive. */
static int apply_limits(void *s, const sf_transport_options *o, sf_error *error) {
  int64_t max = o->max_message_bytes > 0 ? o->max_message_bytes : (int64_t)256 << 20;
  if (zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof max) != 0)
    return sf_error_set(error, SF_ENET, SF_AT(.url = o->endpoint), "zmq_setsockopt ZMQ_MAXMSGSIZE: %s",
                        zmq_strerror(errno));
  int64_t budget = o->buffer_bytes > 0 ? o->buffer_bytes : (int64_t)64 << 20;
  int64_t msg = o->message_bytes > 0 ? o->message_bytes : (int64_t)1 << 20;
  int64_t hwm = budget / msg;
  if (hwm < 2) hwm = 2;
  if (hwm > INT_MAX) hwm = INT_MAX;
  double hs = o->handshake_timeout > 0 ? o->handshake_timeout : 10.0;
  int hs_ms = hs * 1000 > INT_MAX ? INT_MAX : (int)(hs * 1000);
  int rc = 0;
  if (rc == 0) rc = set_int(s, ZMQ_SNDHWM, (int)hwm, "ZMQ_SNDHWM", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_RCVHWM, (int)hwm, "ZMQ_RCVHWM", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_LINGER, 0, "ZMQ_LINGER", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_HANDSHAKE_IVL, hs_ms, "ZMQ_HANDSHAKE_IVL", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_TCP_KEEPALIVE, 1, "ZMQ_TCP_KEEPALIVE", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_TCP_KEEPALIVE_IDLE, 30, "ZMQ_TCP_KEEPALIVE_IDLE", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_TCP_KEEPALIVE_INTVL, 10, "ZMQ_TCP_KEEPALIVE_INTVL", o->endpoint, error);
  if (rc == 0) rc = set_int(s, ZMQ_TCP_KEEPALIVE_CNT, 3, "ZMQ_TCP_KEEPALIVE_CNT", o->endpoint, error);
  return rc;
}

static int check_endpoint(const sf_transport_options *o, bool *tcp, sf_error *error) {
  if (!o || !o->endpoint || !*o->endpoint)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "no endpoint given (tcp://HOST:PORT or ipc://PATH)");
  if (strlen(o->endpoint) >= 480) return sf_error_set(error, SF_EINVAL, SF_AT(.url = o->endpoint), "endpoint too long");
  if (strncmp(o->endpoint, "tcp://", 6) == 0) *tcp = true;
  else if (strncmp(o->endpoint, "ipc://", 6) == 0) *tcp = false;
  else
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = o->endpoint),
                        "unsupported endpoint: use tcp://HOST:PORT (CURVE) or ipc://PATH (local processes)");
  return 0;
}

/* Frees everything; the ROUTER/DEALER first, the ZAP handler last (libzmq admits all without one). */
static void destroy(sf_transport *t) {
  if (t->zap) sf_zap_detach(t->zap, t->socket);
  if (t->socket) zmq_close(t->socket);
  sf_zap_destroy(&t->zap);
  free(t);
}

static int start_curve_server(void *ctx, sf_transport *t, const sf_transport_options *o, sf_error *error) {
  if (!zmq_has("curve"))
    return sf_error_set(error, SF_EUNSUPPORTED, SF_AT(.url = o->endpoint),
                        "this libzmq was built without CURVE (libsodium)");
  if (!o->allowed_keys || !*o->allowed_keys)
    return sf_error_set(
        error, SF_EDENIED, SF_AT(.url = o->endpoint),
        "refusing to listen on tcp:// without an allow-list of worker keys: make key pairs with "
        "`shardflow keygen head` and `shardflow keygen WORKER`, then give the head secret_key: head.key and "
        "allowed_keys: a file or directory with WORKER.pub (or plaintext: true on a trusted network only)");
  if (!o->secret_key_file || !*o->secret_key_file)
    return sf_error_set(
        error, SF_EDENIED, SF_AT(.url = o->endpoint),
        "listening on tcp:// needs the head's secret key (secret_key: head.key; make it with `shardflow keygen head`)");
  int rc = sf_zap_new(o->allowed_keys, o->endpoint, &t->zap, error);
  if (rc < 0) return rc;
  char pub[SF_CURVE_KEY_Z85_LEN + 1], sec[SF_CURVE_KEY_Z85_LEN + 1];
  rc = sf_curve_key_load(o->secret_key_file, pub, sec, error);
  if (rc < 0) return rc;
  int one = 1;
  if (zmq_setsockopt(t->socket, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
      zmq_setsockopt(t->socket, ZMQ_CURVE_SECRETKEY, sec, SF_CURVE_KEY_Z85_LEN) != 0 ||
      zmq_setsockopt(t->socket, ZMQ_ZAP_DOMAIN, SF_ZAP_DOMAIN, strlen(SF_ZAP_DOMAIN)) != 0) {
    explicit_bzero(sec, sizeof sec);
    return sf_error_set(error, SF_ENET, SF_AT(.url = o->endpoint), "cannot make a CURVE server socket: %s",
                        zmq_strerror(errno));
  }
  explicit_bzero(sec, sizeof sec);
#ifdef ZMQ_ZAP_ENFORCE_DOMAIN
  zmq_setsockopt(t->socket, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one); /* draft builds only; ours keeps the handler up instead */
#endif
  /* The ZAP handler before the socket can accept anybody; its thread starts once the socket is bound (requests queue
   * until then). */
  return sf_zap_attach(t->zap, ctx, t->socket, error);
}

int sf_transport_listen(void *zmq_ctx, const sf_transport_options *options, sf_transport **transport, sf_error *error) {
  *transport = NULL;
  bool tcp;
  int rc = check_endpoint(options, &tcp, error);
  if (rc < 0) return rc;
  if (tcp && options->plaintext && options->allowed_keys && *options->allowed_keys)
    return sf_error_set(error, SF_EINVAL, SF_AT(.url = options->endpoint),
                        "plaintext and allowed_keys both given: plaintext cannot check keys; drop one of them");
  sf_transport *t = calloc(1, sizeof *t);
  if (!t) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = options->endpoint), "out of memory");
  snprintf(t->endpoint, sizeof t->endpoint, "%s", options->endpoint);
  t->socket = zmq_socket(zmq_ctx, ZMQ_ROUTER);
  if (!t->socket) {
    rc = sf_error_set(error, SF_ENET, SF_AT(.url = options->endpoint), "zmq_socket(ROUTER): %s", zmq_strerror(errno));
    goto fail;
  }
  rc = apply_limits(t->socket, options, error);
  if (rc == 0) rc = set_int(t->socket, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY", options->endpoint, error);
  if (rc < 0) goto fail;
  if (tcp && !options->plaintext) {
    rc = start_curve_server(zmq_ctx, t, options, error);
    if (rc < 0) goto fail;
  }
  if (zmq_bind(t->socket, options->endpoint) != 0) {
    int e = errno;
    rc = sf_error_set(error, e == EINVAL || e == EPROTONOSUPPORT ? SF_EINVAL : SF_ENET, SF_AT(.url = options->endpoint),
                      "cannot listen: %s%s", zmq_strerror(e),
                      e == EADDRINUSE
                          ? " (another process uses this port: choose another one, or port 0 for any free port)"
                      : e == EADDRNOTAVAIL ? " (no such local address: use an address of this host, or 0.0.0.0)"
                                           : "");
    goto fail;
  }
  size_t len = sizeof t->endpoint;
  if (zmq_getsockopt(t->socket, ZMQ_LAST_ENDPOINT, t->endpoint, &len) != 0)
    snprintf(t->endpoint, sizeof t->endpoint, "%s", options->endpoint);
  if (t->zap) {
    rc = sf_zap_start(t->zap, t->endpoint, error);
    if (rc < 0) goto fail;
  }
  if (tcp && options->plaintext)
    sf_log(SF_LOG_WARNING, NULL, "%s: listening WITHOUT authentication or encryption (plaintext: true); "
            "anyone who can reach this port can join and read the data", t->endpoint);
  *transport = t;
  return 0;
fail:
  destroy(t);
  return rc;
}

int sf_transport_connect(void *zmq_ctx, const sf_transport_options *options, sf_transport **transport, sf_error *error) {
  *transport = NULL;
  bool tcp;
  int rc = check_endpoint(options, &tcp, error);
  if (rc < 0) return rc;
  sf_transport *t = calloc(1, sizeof *t);
  if (!t) return sf_error_set(error, SF_ENOMEM, SF_AT(.url = options->endpoint), "out of memory");
  snprintf(t->endpoint, sizeof t->endpoint, "%s", options->endpoint);
  t->socket = zmq_socket(zmq_ctx, ZMQ_DEALER);
  if (!t->socket) {
    rc = sf_error_set(error, SF_ENET, SF_AT(.url = options->endpoint), "zmq_socket(DEALER): %s", zmq_strerror(errno));
    goto fail;
  }
  rc = apply_limits(t->socket, options, error);
  if (rc < 0) goto fail;
  if (tcp && !options->plaintext) {
    if (!options->secret_key_file || !*options->secret_key_file || !options->server_key_file || !*options->server_key_file) {
      rc = sf_error_set(
          error, SF_EDENIED, SF_AT(.url = options->endpoint),
          "connecting over tcp:// needs this worker's key (--key WORKER.key, from `shardflow keygen WORKER`) and "
          "the head's public key (--server-key head.pub); the head must list WORKER.pub in allowed_keys");
      goto fail;
    }
    char pub[SF_CURVE_KEY_Z85_LEN + 1], sec[SF_CURVE_KEY_Z85_LEN + 1], server[SF_CURVE_KEY_Z85_LEN + 1];
    rc = sf_curve_key_load(options->server_key_file, server, NULL, error);
    if (rc == 0) rc = sf_curve_key_load(options->secret_key_file, pub, sec, error);
    if (rc < 0) goto fail;
    if (zmq_setsockopt(t->socket, ZMQ_CURVE_SERVERKEY, server, SF_CURVE_KEY_Z85_LEN) != 0 ||
        zmq_setsockopt(t->socket, ZMQ_CURVE_PUBLICKEY, pub, SF_CURVE_KEY_Z85_LEN) != 0 ||
        zmq_setsockopt(t->socket, ZMQ_CURVE_SECRETKEY, sec, SF_CURVE_KEY_Z85_LEN) != 0) {
      explicit_bzero(sec, sizeof sec);
      rc = sf_error_set(error, SF_ENET, SF_AT(.url = options->endpoint), "cannot make a CURVE client socket: %s",
                        zmq_strerror(errno));
      goto fail;
    }
    explicit_bzero(sec, sizeof sec);
  }
  /* A refused or restarted peer is retried from 100 ms, backing off to 1 s (not every 100 ms forever). */
  if (set_int(t->socket, ZMQ_RECONNECT_IVL_MAX, 1000, "ZMQ_RECONNECT_IVL_MAX", options->endpoint, error) < 0) {
    rc = SF_ENET;
    goto fail;
  }
  if (zmq_connect(t->socket, options->endpoint) != 0) {
    rc = sf_error_set(error, SF_EINVAL, SF_AT(.url = options->endpoint), "cannot connect: %s", zmq_strerror(errno));
    goto fail;
  }
  *transport = t;
  return 0;
fail:
  destroy(t);
  return rc;
}

void *sf_transport_socket(sf_transport *transport) { return transport ? transport->socket : NULL; }

const char *sf_transport_endpoint(const sf_transport *transport) { return transport ? transport->endpoint : ""; }

void sf_transport_get_stats(const sf_transport *transport, sf_transport_stats *stats) {
  sf_zap_get_stats(transport ? transport->zap : NULL, stats);
}

uint64_t sf_transport_refused(const sf_transport *transport) {
  sf_transport_stats s;
  sf_transport_get_stats(transport, &s);
  return s.refused_mechanism + s.refused_key + s.refused_protocol;
}

void sf_transport_close(sf_transport **transport) {
  if (!transport || !*transport) return;
  sf_transport *t = *transport;
  *transport = NULL;
  destroy(t);
}
