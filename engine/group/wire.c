/* The head/worker wire protocol: protobuf-c header frames, zero-copy payload frames, strict decoding.
 * This file: message types and what the others share; wire_recv.c receives, wire_decode.c checks and builds,
 * wire_encode.c sends. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "wire_codec.h"

_Static_assert((int)SF_WIRE_HELLO == (int)SF_WIRE__MESSAGE_TYPE__HELLO &&
                   (int)SF_WIRE_EPOCH_END == (int)SF_WIRE__MESSAGE_TYPE__EPOCH_END,
               "sf_wire_type and wire.proto's MessageType must agree");

static atomic_uint_fast64_t copied_sent, copied_received;

const char *sf_wire_type_name(sf_wire_type type) {
  switch (type) {
  case SF_WIRE_HELLO: return "HELLO";
  case SF_WIRE_WELCOME: return "WELCOME";
  case SF_WIRE_CREDIT: return "CREDIT";
  case SF_WIRE_UNIT: return "UNIT";
  case SF_WIRE_RESULT: return "RESULT";
  case SF_WIRE_HEARTBEAT: return "HEARTBEAT";
  case SF_WIRE_ERROR: return "ERROR";
  case SF_WIRE_BYE: return "BYE";
  case SF_WIRE_EPOCH_END: return "EPOCH_END";
  }
  return "?";
}

void sf_wire_count_copied(bool sent, uint64_t bytes) { atomic_fetch_add(sent ? &copied_sent : &copied_received, bytes); }

void sf_wire_copy_stats(uint64_t *sent, uint64_t *received) {
  if (sent) *sent = atomic_load(&copied_sent);
  if (received) *received = atomic_load(&copied_received);
}

void sf_wire_message_clear(sf_wire_message *msg) {
  if (!msg) return;
  for (int i = 0; msg->samples && i < msg->n_samples; i++) sf_sample_destroy(&msg->samples[i]);
  free(msg->samples);
  free(msg->text);
  free(msg->errors);
  free(msg->stats);
  sf_graph_destroy(&msg->stages);
  memset(msg, 0, sizeof *msg);
}

/* The endpoint a socket was last bound or connected to, for error messages. */
void sf_wire_socket_endpoint(void *socket, char *buf, size_t size) {
  buf[0] = '\0';
  size_t n = size;
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, buf, &n) != 0) buf[0] = '\0';
  buf[size - 1] = '\0';
}
