/* shardflow handoff: a stage hands samples to one thread of the embedding program (Python map functions) and back. */
#ifndef SHARDFLOW_HANDOFF_H
#define SHARDFLOW_HANDOFF_H

#include <stdbool.h>
#include <stddef.h>

#include "shardflow/stage.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * A bounded FIFO between a stage (the `python` stage, stages/python.c) and
 * one thread of the embedding program that transforms samples (the Python
 * package's map thread).  The stage side never blocks (it runs on the
 * executor's pool); the program's thread waits in sf_handoff_take(), so the
 * pool never waits for it and never holds the program's locks (Python's GIL).
 * Results come back in the order items went in; epoch markers pass through
 * in place.  The program gives a node its handoff with sf_graph_attach; the
 * stage reads it with sf_node_attachment.  Refcounted; thread-safe.
 */
typedef struct sf_handoff sf_handoff;

/** What the program's thread made of a sample (sf_handoff_finish / sf_handoff_get). */
enum {
  SF_HANDOFF_PASS = 0, /**< the result sample goes on */
  SF_HANDOFF_DROP = 1, /**< dropped on purpose (Python's None): counted as filtered, no error record */
  /* any negative SF_E… code: the function failed on this sample; the message says how.  SF_ECANCELED:
     the program asked to stop (Python's KeyboardInterrupt, SystemExit): the pipeline fails with it
     whatever its error_policy, as skipping the sample would ignore the request */
};

/**
 * Creates a handoff holding up to capacity (1..65536) samples in flight.
 * *handoff holds one reference (drop it with sf_handoff_unref).  Returns 0,
 * SF_EINVAL (capacity) or SF_ENOMEM.
 */
SF_API int sf_handoff_new(sf_handoff **handoff, int capacity);

/** A new reference to handoff (which must hold one already), returned; NULL-safe. */
SF_API sf_handoff *sf_handoff_ref(sf_handoff *handoff);

/** Drops a reference and sets *handoff to NULL; the last one frees the handoff and the items it holds. NULL-safe. */
SF_API void sf_handoff_unref(sf_handoff **handoff);

/**
 * Closes the handoff: sf_handoff_take() returns SF_EOF from then on (the
 * program's thread ends), and samples still inside are freed with it.
 */
SF_API void sf_handoff_close(sf_handoff *handoff);

/**
 * Stage side: a function called (under the handoff's lock, on the program's
 * thread) when results are ready that sf_handoff_get() found missing, so a
 * stage that returned SF_EAGAIN is stepped again: the python stage passes
 * sf_node_notify.  Calls come in bunches (a wakeup costs more than a small
 * map): once half the ring is done, or when the program's thread has nothing
 * left to take.  NULL removes it (call that in uninit; after it returns, fn
 * is not running and never runs).
 */
SF_API void sf_handoff_set_wake(sf_handoff *handoff, void (*fn)(sf_node *), sf_node *node);

/** Stage side: true when sf_handoff_put() would take another item. */
SF_API bool sf_handoff_can_put(sf_handoff *handoff);

/**
 * Stage side, never blocks: appends item (a sample, or an epoch marker that
 * passes straight through).  Returns 0 and consumes item (kind set to
 * SF_ITEM_NONE); SF_EAGAIN when full (item untouched).
 */
SF_API int sf_handoff_put(sf_handoff *handoff, sf_item *item);

/** Stage side: items put and not yet returned by sf_handoff_get(). */
SF_API int sf_handoff_in_flight(sf_handoff *handoff);

/**
 * Stage side, never blocks: takes the oldest item once it is done.  Returns 0
 * with *item (the caller owns it) and *status: SF_HANDOFF_PASS (item is the
 * result sample, or the epoch marker), SF_HANDOFF_DROP (item is the original
 * sample, for its key: free it), or a negative code (item is the original
 * sample; message holds the function's error, cut to size).  Returns SF_EAGAIN
 * when the oldest item is not done yet or nothing is in flight.
 */
SF_API int sf_handoff_get(sf_handoff *handoff, sf_item *item, int *status, char *message, size_t size);

/**
 * Program side (one thread only): waits up to timeout seconds (negative:
 * forever) for the next sample.  Returns 0 with *sample borrowed: it stays
 * valid, and the program's thread alone uses it, until sf_handoff_finish();
 * SF_ETIMEDOUT; SF_EOF once the handoff is closed.
 */
SF_API int sf_handoff_take(sf_handoff *handoff, sf_sample **sample, double timeout);

/**
 * Program side: finishes the sample sf_handoff_take() returned.  status is
 * SF_HANDOFF_PASS with *result the new sample (consumed, set to NULL; NULL
 * result: the taken sample goes on unchanged), SF_HANDOFF_DROP, or a negative
 * SF_E… code with message (copied; may be NULL).  After a close, only frees
 * *result.
 */
SF_API void sf_handoff_finish(sf_handoff *handoff, sf_sample **result, int status, const char *message);

/*
 * Helpers for bindings that do not mirror sf_sample (Python's ctypes).
 */

/** The sample's key (borrowed; "" when it has none). */
SF_API const char *sf_sample_key(const sf_sample *sample);

/** Number of fields of sample. */
SF_API int sf_sample_field_count(const sf_sample *sample);

/**
 * Field i of sample (borrowed, valid while the sample is), materialized first
 * when deferred, so its tensor has data.  NULL when i is out of range or
 * out of memory.
 */
SF_API const sf_field *sf_sample_field_at(sf_sample *sample, int i);

/**
 * A new sample with src's key, URL, epoch, shard, index, pass and offset and
 * no fields: the start of a map function's result.  NULL when out of memory.
 */
SF_API sf_sample *sf_sample_derive(const sf_sample *src);

/**
 * Appends a field called name to sample holding a copy of the C-contiguous
 * data (dtype, ndim dimensions of shape; an encoded field is uint8 [n]).
 * Returns 0; SF_EDUP (name taken); SF_EINVAL (name too long, too many fields
 * or dims, bad dtype); SF_ENOMEM.
 */
SF_API int sf_sample_add_field_copy(sf_sample *sample, const char *name, bool encoded, sf_dtype dtype,
                                    int ndim, const int64_t *shape, const void *data);

/**
 * Appends a field called name sharing field i of src's buffer (no copy; the
 * encoded flag follows).  Returns 0, SF_EDUP, SF_EINVAL (i out of range, too
 * many fields) or SF_ENOMEM.
 */
SF_API int sf_sample_add_field_ref(sf_sample *sample, const char *name, sf_sample *src, int i);

#ifdef __cplusplus
}
#endif
#endif
