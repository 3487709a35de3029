/*
 * The authentication side of a CURVE listening transport (engine/group/transport.c):
 * the allow-list of worker keys and the handler thread that serves ZAP
 * (RFC 27) for the socket and reads its monitor events.  Private to
 * engine/group/transport*.c; engine/group/transport.h is the interface.
 */
#ifndef SF_ENGINE_TRANSPORT_ZAP_H
#define SF_ENGINE_TRANSPORT_ZAP_H

#include "transport.h"

/* The ZAP domain of our listening socket: requests for any other domain are refused. */
#define SF_ZAP_DOMAIN "shardflow"

typedef struct sf_zap sf_zap;

/*
 * Loads the allow-list at allowed_keys (a file of Z85 public keys, one a
 * line, or a directory of *.pub) for the socket at endpoint (named in every
 * message).  Returns 0, or SF_ENOENT/SF_EIO/SF_EFORMAT/SF_ETOOBIG/SF_ENOMEM
 * with *error naming the file (and line).  *zap is the caller's: free it with
 * sf_zap_destroy(), also after a failure.
 */
int sf_zap_new(const char *allowed_keys, const char *endpoint, sf_zap **zap, sf_error *error);

/*
 * Binds the ZAP endpoint of ctx and monitors socket (a CURVE server with
 * SF_ZAP_DOMAIN, not bound yet: libzmq admits any CURVE client while no ZAP
 * handler is bound).  Returns 0, SF_EINVAL (ctx serves ZAP already: one
 * listening CURVE transport per context) or SF_ENET.
 */
int sf_zap_attach(sf_zap *zap, void *ctx, void *socket, sf_error *error);

/* Starts the handler thread once the socket is bound at endpoint (the resolved address, for messages). */
int sf_zap_start(sf_zap *zap, const char *endpoint, sf_error *error);

/* The refusal counts (sf_transport_get_stats). Safe from any thread. */
void sf_zap_get_stats(const sf_zap *zap, sf_transport_stats *stats);

/* Stops monitoring socket: call before closing it. */
void sf_zap_detach(sf_zap *zap, void *socket);

/*
 * After the socket is closed: stops the thread, logs the refusal totals,
 * unbinds ZAP and frees; sets *zap to NULL.  NULL-safe.
 */
void sf_zap_destroy(sf_zap **zap);

#endif
