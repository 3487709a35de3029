/* What the wire's three files share (wire.c: receiving and the common part; wire_decode.c; wire_encode.c). */
#ifndef SF_ENGINE_WIRE_CODEC_H
#define SF_ENGINE_WIRE_CODEC_H

#include <stdbool.h>
#include <stdint.h>

#include "wire.h"
#include "wire.pb-c.h"

/* String limits (bytes, excluding the NUL). */
/* Keys have no limit of their own (tar paths); this one only bounds what a peer may send. */
enum { SF_WIRE_KEY_MAX = 65535, SF_WIRE_NAME_MAX = SF_FIELD_NAME_MAX - 1, SF_WIRE_URL_MAX = 4095 };

/* Which parts of a header a message type carries. */
static inline bool sf_wire_carries_samples(int type) { return type == SF_WIRE_UNIT || type == SF_WIRE_RESULT; }
static inline bool sf_wire_carries_errors(int type) { return type == SF_WIRE_RESULT || type == SF_WIRE_ERROR; }
static inline bool sf_wire_carries_stats(int type) { return type == SF_WIRE_HEARTBEAT || type == SF_WIRE_RESULT; }
static inline bool sf_wire_carries_text(int type) {
  return type == SF_WIRE_HELLO || type == SF_WIRE_WELCOME || type == SF_WIRE_BYE;
}

/* Counts bytes copied into (sent) or out of (received) frames, for sf_wire_copy_stats. */
void sf_wire_count_copied(bool sent, uint64_t bytes);

/* The endpoint a socket was last bound or connected to, for error messages. */
void sf_wire_socket_endpoint(void *socket, char *buf, size_t size);

/* sf_wire_decode, with the ring of the peer that sent it (NULL: none; extents are refused). */
int sf_wire_decode_from(const uint8_t *header, size_t header_len, sf_buffer *const *frames, int n_frames,
                        sf_shm_ring *ring, sf_wire_message *msg, sf_error *error);

#endif
