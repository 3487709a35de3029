/*
 * ZeroMQ sockets between a head and its workers, with CURVE authentication
 * (RFC 26) and a ZAP handler (RFC 27) that admits only listed public keys.
 * Contract header: engine/transport.c implements it.
 */
#ifndef SF_ENGINE_TRANSPORT_H
#define SF_ENGINE_TRANSPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "shardflow/error.h"

typedef struct sf_transport_options {
  const char *endpoint;            /* tcp://ADDR:PORT or ipc://PATH */
  /* CURVE (tcp:// only; ipc:// relies on file permissions and ignores these) */
  const char *secret_key_file;     /* this side's key file written by `shardflow keygen` */
  const char *server_key_file;     /* connect: the head's public key file (NAME.pub or NAME.key) */
  const char *allowed_keys;        /* listen: a file of Z85 public keys (one a line, # comments) or a directory of *.pub */
  bool plaintext;                  /* tcp:// without CURVE: must be asked for explicitly */
  int64_t max_message_bytes;       /* ZMQ_MAXMSGSIZE for every frame received; 0 = 256 MiB */
  int64_t buffer_bytes;            /* send/receive byte budget; HWMs are derived from it; 0 = 64 MiB */
  int64_t message_bytes;           /* expected message size used for that derivation; 0 = 1 MiB */
  double handshake_timeout;        /* seconds (ZMQ_HANDSHAKE_IVL); 0 = 10 s */
} sf_transport_options;

typedef struct sf_transport sf_transport;

/*
 * Creates a ROUTER socket bound to options->endpoint.  tcp:// without
 * plaintext needs secret_key_file and allowed_keys: with no allow-list the
 * call fails (SF_EDENIED) rather than admit any client that knows the server
 * key (libzmq's behaviour without a ZAP handler).  Starts a ZAP handler
 * thread on ctx that admits only the listed keys and counts and logs every
 * refusal (mechanism, peer address, key).  Returns 0 or SF_EINVAL (bad
 * endpoint), SF_ENOENT/SF_EFORMAT (key files), SF_EDENIED, SF_ENET (bind
 * failed: address in use...); *error names the endpoint or file and what to do.
 * *transport owns the socket and the handler; the socket is used by one thread.
 */
int sf_transport_listen(void *zmq_ctx, const sf_transport_options *options, sf_transport **transport,
                        sf_error *error);

/* A DEALER socket connected to options->endpoint (CURVE client for tcp:// unless plaintext). */
int sf_transport_connect(void *zmq_ctx, const sf_transport_options *options, sf_transport **transport,
                         sf_error *error);

/* The zmq socket (borrowed). */
void *sf_transport_socket(sf_transport *transport);

/* The endpoint actually bound (tcp://...:0 resolves to the chosen port). Borrowed. */
const char *sf_transport_endpoint(const sf_transport *transport);

/* Connections the ZAP handler refused so far (wrong mechanism, unknown key). */
uint64_t sf_transport_refused(const sf_transport *transport);

/* Closes the socket (linger 0), stops the ZAP handler, frees; sets *transport to NULL. */
void sf_transport_close(sf_transport **transport);

#endif
