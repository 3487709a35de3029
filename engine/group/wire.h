/*
 * The wire protocol between a head and its workers: one protobuf-c header
 * frame (engine/group/wire.proto) followed by raw payload frames, one per tensor,
 * sent zero-copy (zmq_msg_init_data with a free callback that drops an
 * sf_buffer reference) and received zero-copy (the received zmq_msg_t backs
 * the sf_buffer of the rebuilt field).  docs/protocol.md gives the message
 * sequence per socket.  Contract header: engine/group/wire.c implements it.
 */
#ifndef SF_ENGINE_WIRE_H
#define SF_ENGINE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "graph.h"
#include "shm_ring.h"
#include "shardflow/buffer.h"
#include "shardflow/error.h"
#include "shardflow/sample.h"

/* Bumped on any incompatible change of engine/group/wire.proto; peers must match. */
#define SF_WIRE_VERSION 2

/* Limits every decoded header is checked against (a hostile peer meets them first). */
enum {
  SF_WIRE_MAX_SAMPLES = 4096,        /* samples in one UNIT or RESULT */
  SF_WIRE_MAX_FRAMES = 65536,        /* payload frames after the header */
  SF_WIRE_MAX_TEXT = 1 << 20,        /* bytes of text, and of one stage option's value */
  SF_WIRE_MAX_STAGES = 64,           /* stages of a group in WELCOME */
  SF_WIRE_MAX_OPTIONS = 256,         /* options of one stage in WELCOME */
  SF_WIRE_MAX_NAME = 64,             /* bytes of a stage's type or name, or an option's key */
  SF_WIRE_MAX_ERRORS = 256,          /* error records in one message */
  SF_WIRE_MAX_STATS = 64,            /* stage statistics in one message */
  SF_WIRE_MAX_HEADER = 16 << 20,     /* bytes of the header frame */
};

typedef enum sf_wire_type {
  SF_WIRE_HELLO = 1,   /* worker -> head: I joined (name, pid, threads) */
  SF_WIRE_WELCOME,     /* head -> worker: the group's graph and the run's settings */
  SF_WIRE_CREDIT,      /* worker -> head: I can take `credits` more units */
  SF_WIRE_UNIT,        /* head -> worker: work unit `unit`: samples to run through the group */
  SF_WIRE_RESULT,      /* worker -> head: unit `unit` done: its output samples, skipped count, errors */
  SF_WIRE_HEARTBEAT,   /* both ways: I am alive (sequence, per-stage stats) */
  SF_WIRE_ERROR,       /* worker -> head: error records outside any unit (a failed init) */
  SF_WIRE_BYE,         /* both ways: leaving (worker on SIGTERM; head at the end of the run) */
  SF_WIRE_EPOCH_END,   /* head -> worker: epoch `epoch` complete (metrics only) */
} sf_wire_type;

/* One stage's metrics as carried in HEARTBEAT and RESULT. */
typedef struct sf_wire_stage_stats {
  char name[32];
  uint64_t items, bytes, busy_ns, wait_ns, errors;
} sf_wire_stage_stats;

/* A ROUTER peer's routing id (ZMQ_ROUTER prefixes every message with it). */
typedef struct sf_wire_peer {
  uint8_t id[256];
  size_t len;
} sf_wire_peer;

/*
 * One message, decoded.  Fields that do not apply to a type are 0/NULL.
 * A received message owns everything it points at (free with
 * sf_wire_message_clear); a caller may take samples[i] by setting it NULL.
 * A message being sent is borrowed: sf_wire_send takes buffer references of
 * its own for the payload frames.
 */
typedef struct sf_wire_message {
  sf_wire_type type;
  sf_wire_peer peer;            /* recv on a ROUTER: who sent it; send on a ROUTER: to whom */
  uint64_t unit;                /* UNIT, RESULT */
  uint64_t epoch;               /* UNIT, RESULT, EPOCH_END */
  uint32_t credits;             /* CREDIT */
  uint64_t sequence;            /* HEARTBEAT */
  char *text;                   /* HELLO: worker name; BYE: reason */
  /* HELLO */
  int64_t pid;
  uint32_t threads;             /* HELLO: the worker's threads; WELCOME: threads the head asks it to run (0 = its own) */
  /* WELCOME: what the worker's pipeline needs to reproduce the head's results */
  uint64_t seed, epochs;
  int32_t rank, world_size;
  int32_t error_policy;
  double heartbeat_interval;    /* seconds */
  double heartbeat_timeout;     /* seconds without a message before a peer counts as dead */
  /* WELCOME: the group's stages as the graph's intermediate form (nodes with their options and
   * the head's file and lines). Sending borrows it; a received message owns a new graph. */
  sf_graph *stages;
  /* UNIT, RESULT */
  sf_sample **samples;
  int n_samples;
  uint64_t samples_in;          /* RESULT: samples the unit had */
  uint64_t skipped;             /* RESULT: samples dropped by errors */
  uint64_t filtered;            /* RESULT: samples a stage dropped on purpose (a filter; not errors) */
  sf_error *errors;             /* RESULT, ERROR */
  int n_errors;
  sf_wire_stage_stats *stats;   /* HEARTBEAT, RESULT */
  int n_stats;
  /* Sending a RESULT: the worker's shared-memory ring (borrowed), or NULL.  Payloads of SF_SHM_MIN_BYTES or
   * more that fit go into it and only their extents go over the socket; the others go as frames. */
  sf_shm_ring *shm;
  uint64_t shm_freed;           /* UNIT, HEARTBEAT from a head: ring extents before it are released */
  uint64_t frame_bytes, ring_bytes; /* received: payload bytes that came as frames / through the ring */
} sf_wire_message;

/*
 * Sends msg as one multipart message (routing-id frame first when
 * msg->peer.len > 0, for a ROUTER socket).  Every sample field becomes one
 * payload frame: contiguous tensors go zero-copy (a buffer reference is held
 * until libzmq has sent the frame), deferred fields are written by their
 * recipe into a new buffer first, strided ones are copied.  flags: 0 or
 * ZMQ_DONTWAIT.  Returns 0, SF_EAGAIN (DONTWAIT and the high-water mark is
 * reached: nothing was sent), SF_ENET (zmq error, *error says which), SF_ENOMEM.
 */
int sf_wire_send(void *socket, const sf_wire_message *msg, int flags, sf_error *error);

/*
 * Receives one multipart message and decodes it into *msg (routed: the socket
 * is a ROUTER, read the routing-id frame into msg->peer).  flags: 0 or
 * ZMQ_DONTWAIT.  Returns 0; SF_EAGAIN (nothing there); SF_EFORMAT or
 * SF_ETOOBIG for a malformed or oversized message, which is consumed whole
 * and dropped (msg->peer still says who sent it; *error says what was wrong);
 * SF_ENET for a socket error.
 */
int sf_wire_recv(void *socket, bool routed, sf_wire_message *msg, int flags, sf_error *error);

/*
 * Returns a new reference to the shared-memory ring of the peer that sent a message, or NULL when it has
 * none (its extents are then refused).  Called by sf_wire_recv_ring on the receiving thread.
 */
typedef sf_shm_ring *(*sf_wire_ring_fn)(void *opaque, const sf_wire_peer *peer);

/*
 * sf_wire_recv for a head with local workers: a RESULT's shared-memory extents become views of the ring
 * ring_of(opaque, peer) gives (checked by sf_shm_ring_view: in order, in bounds, not over an extent in use);
 * fields hold them until released.  Returns as sf_wire_recv; SF_EFORMAT also for extents from a peer without
 * a ring or that break those rules.
 */
int sf_wire_recv_ring(void *socket, bool routed, sf_wire_ring_fn ring_of, void *opaque, sf_wire_message *msg,
                      int flags, sf_error *error);

/*
 * Decodes a header frame and its payload frames (borrowed; fields keep
 * references to them) into *msg, checking every limit above, the version,
 * the type, dtypes, ndim <= SF_TENSOR_MAX_DIMS, non-negative shapes whose byte
 * size equals the frame's, and frame indexes.  Used by sf_wire_recv and the
 * fuzz target.  Returns 0, SF_EFORMAT or SF_ETOOBIG (*msg is then cleared).
 */
int sf_wire_decode(const uint8_t *header, size_t header_len, sf_buffer *const *frames, int n_frames,
                   sf_wire_message *msg, sf_error *error);

/*
 * Bytes this process has copied so far (process-wide counters, for metrics and
 * tests): *sent, by sf_wire_send for strided tensors (deferred fields are
 * written once by their recipe and not counted); *received, by sf_wire_recv
 * for payload frames whose address does not suit their dtype's alignment
 * (libzmq packs small received frames into its receive batch at any offset).
 * Either pointer may be NULL.
 */
void sf_wire_copy_stats(uint64_t *sent, uint64_t *received);

/* Frees what a received message owns and zeroes it. */
void sf_wire_message_clear(sf_wire_message *msg);

/* "HELLO", "UNIT"...; "?" for an unknown type. */
const char *sf_wire_type_name(sf_wire_type type);

#endif
