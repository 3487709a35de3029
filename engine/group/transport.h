/*
 * ZeroMQ sockets between a head and its workers, with CURVE authentication
 * (RFC 26) and a ZAP handler (RFC 27) that admits only listed public keys.
 * The one interface of three files: engine/group/transport.c (sockets),
 * engine/group/transport_zap.c (allow-list, ZAP handler, refusal counts) and
 * engine/group/transport_keys.c (key files, keygen).
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

/*
 * Additions by the transport implementation (helper "curve"): refusal
 * statistics, key files.
 */

/* What the listening side refused, by kind (all counts since listen). */
typedef struct sf_transport_stats {
  uint64_t refused_mechanism;  /* NULL/PLAIN (or any non-CURVE) clients on a CURVE socket */
  uint64_t refused_key;        /* CURVE clients whose public key is not on the allow-list */
  uint64_t refused_protocol;   /* connections dropped before a completed handshake: garbage
                                  bytes, bad greetings, handshake timeouts (best effort) */
  uint64_t accepted;           /* handshakes that succeeded */
} sf_transport_stats;

/*
 * Fills *stats with the listening transport's counts (all zero for a
 * connecting or plaintext transport).  Safe to call from any thread.
 * sf_transport_refused() is refused_mechanism + refused_key + refused_protocol.
 */
void sf_transport_get_stats(const sf_transport *transport, sf_transport_stats *stats);

/* Length of a Z85-encoded CURVE key (32 bytes) without its NUL. */
#define SF_CURVE_KEY_Z85_LEN 40

/*
 * `shardflow keygen`: makes a CURVE key pair (zmq_curve_keypair) and writes
 * DIR/NAME.key (public and secret key, mode 0600, created exclusively) and
 * DIR/NAME.pub (public key only, mode 0644), both in ZeroMQ's certificate
 * text format (comments, `public-key = "Z85"`, `secret-key = "Z85"`).  dir
 * NULL means ".".  If public_z85 is not NULL it receives the public key
 * (SF_CURVE_KEY_Z85_LEN + 1 bytes).  Existing files are not overwritten.
 * Returns 0, SF_EINVAL (NAME empty or with '/'), SF_EIO (exists, cannot
 * write: *error names the file), SF_EUNSUPPORTED (libzmq without CURVE).
 */
int sf_curve_keygen(const char *dir, const char *name, char *public_z85, sf_error *error);

/*
 * Reads a key file written by `shardflow keygen` (or a CZMQ certificate, or
 * a file holding one bare Z85 key): the public key into public_z85 and, when
 * secret_z85 is not NULL, the secret key (both SF_CURVE_KEY_Z85_LEN + 1
 * bytes, NUL-terminated).  A public key may come from NAME.pub or NAME.key;
 * a secret key only from a regular file that neither group nor others may
 * read (else SF_EDENIED, saying `chmod 600 FILE`).  The pair is checked
 * (the public key must derive from the secret key).  Returns 0, SF_ENOENT
 * (missing), SF_EIO (unreadable), SF_EDENIED (permissions), SF_EFORMAT (no
 * valid key in it, a mismatched pair).  *error names the file.
 */
int sf_curve_key_load(const char *path, char *public_z85, char *secret_z85, sf_error *error);

#endif
