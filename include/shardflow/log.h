/* shardflow's log callback: every line the library writes goes through one handler. */
#ifndef SHARDFLOW_LOG_H
#define SHARDFLOW_LOG_H

#include "shardflow/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How serious a log record is (bindings map these to their own levels). */
typedef enum sf_log_level {
  SF_LOG_ERROR = 0,   /**< an error record: a bad sample, shard or graph value; counted, the error policy decides */
  SF_LOG_WARNING = 1, /**< something is wrong and the run goes on: a refused peer, a dropped message, a lost worker */
  SF_LOG_INFO = 2,    /**< progress and accounts: a worker joined, download and cache totals at a node's end */
} sf_log_level;

/**
 * Or-ed into a level given to sf_node_log() (SF_LOG_INFO | SF_LOG_UNPREFIXED): the default handler leaves out
 * its "shardflow: " prefix, for a line with a layout of its own that CLI users and scripts read (tar_split's
 * download and cache account, "STAGE: message"). A handler set with sf_log_set_handler() gets the level
 * without it.
 */
#define SF_LOG_UNPREFIXED 0x100

/**
 * Receives one log record.  level is an sf_log_level; stage is the name of
 * the node the record is about, or NULL for the engine itself (a socket, a
 * worker process); message is one line of text without a trailing newline
 * (for SF_LOG_ERROR, the error record as sf_error_format() writes it, less
 * the stage: "URL @ byte OFFSET (key KEY): what happened").  Both strings are
 * borrowed for the call: copy what you keep.
 *
 * The handler may be called from any engine thread (stage threads, the
 * network thread of a group, the ZAP handler), and from several at once: it
 * must be thread-safe and should return quickly (the thread that logs waits).
 * It cannot swap handlers (sf_log_set_handler() returns SF_EINVAL there);
 * library calls it makes that log go to the default, never back to it.
 */
typedef void (*sf_log_handler)(void *opaque, int level, const char *stage, const char *message);

/**
 * Sends the library's log records to handler, with opaque passed back, for
 * the whole process (every graph and pipeline).  handler NULL restores the
 * default, which writes one line to stderr: "shardflow: ", "error: " for
 * SF_LOG_ERROR, "STAGE: " when there is a stage, then the message (the lines
 * that always had a layout of their own keep it: tar_split's download and
 * cache account is "STAGE: message", `shardflow worker`'s lines start with
 * "shardflow worker NAME:").  The library writes nothing to stdout or stderr
 * except through the handler.  Records are not filtered by level; error
 * records stop after the first 20 of a pipeline (the rest are counted).
 *
 * Returns 0 once no call of the previous handler is running any more (so its
 * opaque may be freed, or a binding unloaded, right after); SF_EINVAL when
 * called from inside a handler (it would wait for itself) and nothing changes.
 * Thread-safe.
 */
SF_API int sf_log_set_handler(sf_log_handler handler, void *opaque);

#ifdef __cplusplus
}
#endif
#endif
