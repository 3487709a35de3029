/* The head/worker wire protocol: protobuf-c header frames, zero-copy payload frames, strict decoding.
 * This file: message types, receiving from a socket; wire_decode.c checks and builds; wire_encode.c sends. */
#include <errno.h>
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

/* ------------------------------------------------------------------------------------------------ */
/* Receiving                                                                                        */

void sf_wire_socket_endpoint(void *socket, char *buf, size_t size) {
  buf[0] = '\0';
  size_t n = size;
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, buf, &n) != 0) buf[0] = '\0';
  buf[size - 1] = '\0';
}

static int zmq_failure(void *socket, const char *what, sf_error *error) {
  int e = zmq_errno();
  char endpoint[256];
  sf_wire_socket_endpoint(socket, endpoint, sizeof endpoint);
  return sf_error_set(error, SF_ENET, SF_AT(.url = endpoint), "wire: %s failed: %s", what, zmq_strerror(e));
}

/* sf_buffer free function of a received frame: closes and frees its heap zmq_msg_t. */
static void free_frame(void *opaque, uint8_t *data) {
  zmq_msg_t *m = opaque;
  zmq_msg_close(m);
  free(m);
}

/* Receives and discards the rest of a multipart message. */
static void drain(void *socket, bool more) {
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, socket, 0) < 0) {
      zmq_msg_close(&m);
      return;
    }
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
}

int sf_wire_recv(void *socket, bool routed, sf_wire_message *msg, int flags, sf_error *error) {
  return sf_wire_recv_ring(socket, routed, NULL, NULL, msg, flags, error);
}

/*
 * The first parts of a message: the peer's routing id (routed sockets) into msg->peer, then the header frame
 * into *part (initialised here; the caller closes it). *more says whether payload frames follow. Returns 0,
 * SF_EAGAIN (nothing waiting, flags ZMQ_DONTWAIT) or fails.
 */
static int recv_header(void *socket, bool routed, sf_wire_message *msg, int flags, zmq_msg_t *part, bool *more,
                       sf_error *error) {
  zmq_msg_init(part);
  if (zmq_msg_recv(part, socket, flags) < 0) {
    if (zmq_errno() == EAGAIN) return SF_EAGAIN;
    return zmq_failure(socket, "receiving a message", error);
  }
  *more = zmq_msg_more(part);
  if (!routed) return 0;
  size_t n = zmq_msg_size(part);
  if (n > sizeof msg->peer.id) n = sizeof msg->peer.id;
  memcpy(msg->peer.id, zmq_msg_data(part), n);
  msg->peer.len = n;
  zmq_msg_close(part);
  zmq_msg_init(part);
  /* The other parts of a multipart message arrive together with the first: no wait. */
  if (!*more) {
    char endpoint[256];
    sf_wire_socket_endpoint(socket, endpoint, sizeof endpoint);
    return sf_error_set(error, SF_EFORMAT, SF_AT(.url = endpoint), "wire: a message with no header frame");
  }
  if (zmq_msg_recv(part, socket, 0) < 0) return zmq_failure(socket, "receiving a message", error);
  *more = zmq_msg_more(part);
  return 0;
}

/*
 * The payload frames that follow the header, each a buffer over its own heap zmq_msg_t, into *frames (grown
 * here, the caller frees it and unrefs each) and *n_frames; frames past SF_WIRE_MAX_FRAMES are counted in
 * *extra and dropped. Returns 0, SF_ENOMEM (the rest drained) or fails receiving.
 */
static int recv_frames(void *socket, bool more, sf_buffer ***frames, int *n_frames, long long *extra,
                       sf_error *error) {
  int capacity = 0;
  while (more) {
    zmq_msg_t *m = malloc(sizeof *m);
    if (!m || (*n_frames == capacity && *n_frames < SF_WIRE_MAX_FRAMES)) {
      int cap = capacity ? capacity * 2 : 16;
      if (cap > SF_WIRE_MAX_FRAMES) cap = SF_WIRE_MAX_FRAMES;
      sf_buffer **grown = m ? realloc(*frames, (size_t)cap * sizeof **frames) : NULL;
      if (!grown) {
        free(m);
        drain(socket, more);
        return SF_ENOMEM;
      }
      *frames = grown;
      capacity = cap;
    }
    zmq_msg_init(m);
    if (zmq_msg_recv(m, socket, 0) < 0) {
      zmq_msg_close(m);
      free(m);
      return zmq_failure(socket, "receiving a message", error);
    }
    more = zmq_msg_more(m);
    if (*n_frames >= SF_WIRE_MAX_FRAMES) { /* count and drop: the message is rejected whole */
      (*extra)++;
      zmq_msg_close(m);
      free(m);
      continue;
    }
    (*frames)[*n_frames] = sf_buffer_wrap(zmq_msg_data(m), zmq_msg_size(m), free_frame, m);
    if (!(*frames)[*n_frames]) {
      zmq_msg_close(m);
      free(m);
      drain(socket, more);
      return SF_ENOMEM;
    }
    (*n_frames)++;
  }
  return 0;
}

int sf_wire_recv_ring(void *socket, bool routed, sf_wire_ring_fn ring_of, void *opaque, sf_wire_message *msg,
                      int flags, sf_error *error) {
  memset(msg, 0, sizeof *msg);
  zmq_msg_t part;
  bool more = false;
  int r = recv_header(socket, routed, msg, flags, &part, &more, error);
  if (r < 0) {
    zmq_msg_close(&part);
    return r;
  }
  /* The header frame in `part`; the payload frames follow. */
  sf_buffer **frames = NULL;
  int n_frames = 0;
  long long extra = 0;
  r = recv_frames(socket, more, &frames, &n_frames, &extra, error);
  if (r == SF_ENOMEM) {
    sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "wire: out of memory receiving a message");
  } else if (r == 0 && extra) {
    char endpoint[256];
    sf_wire_socket_endpoint(socket, endpoint, sizeof endpoint);
    r = sf_error_set(error, SF_ETOOBIG, SF_AT(.url = endpoint),
                     "wire: a message with %lld payload frames; at most %d are allowed", n_frames + extra,
                     SF_WIRE_MAX_FRAMES);
  } else if (r == 0) {
    sf_shm_ring *ring = ring_of ? ring_of(opaque, &msg->peer) : NULL;
    r = sf_wire_decode_from(zmq_msg_data(&part), zmq_msg_size(&part), frames, n_frames, ring, msg, error);
    sf_shm_ring_unref(&ring);
    if (r < 0 && error && !error->url[0]) sf_wire_socket_endpoint(socket, error->url, sizeof error->url);
  }
  zmq_msg_close(&part);
  for (int i = 0; i < n_frames; i++) sf_buffer_unref(&frames[i]); /* fields hold references of their own */
  free(frames);
  return r;
}
