/* shardflow samples, shards and batches: what flows along the edges of a graph. */
#ifndef SHARDFLOW_SAMPLE_H
#define SHARDFLOW_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shardflow/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Longest field name, including the NUL ("seg.png", "cls"). */
#define SF_FIELD_NAME_MAX 32
/** Most fields a sample or batch may carry. */
#define SF_MAX_FIELDS 16

/**
 * How to produce a deferred field's values (see sf_field).  A stage that
 * knows how to compute a field embeds this struct first in its own and fills
 * both callbacks; the recipe keeps references to everything write() reads
 * (source tensors, tables), never pointers into a node's private data, since
 * the field may outlive the node that made it.  Plugins make recipes this
 * way; the engine's own kinds (an undecoded JPEG, augment's pending
 * transform) are engine-internal structs behind the same two callbacks, so a
 * stage must never look inside a recipe it did not make: materialise it.
 * The engine charges write()'s time to the node that deferred the field.
 */
typedef struct sf_field_recipe sf_field_recipe;
struct sf_field_recipe {
  /**
   * Writes the field's values into dst: C-contiguous, with the dtype and
   * shape of the field's tensor header, sf_tensor_nbytes() bytes.  Cannot
   * fail (everything it needs is allocated when the recipe is made), may run
   * on any thread, and writes the same values however often it runs.
   */
  void (*write)(const sf_field_recipe *recipe, void *dst);
  /** Frees the recipe and drops the references it holds. */
  void (*destroy)(sf_field_recipe *recipe);
};

/**
 * One named field of a sample or batch.  Encoded fields hold the member's
 * bytes as a uint8 tensor of shape [n]; decoded fields hold a tensor (images
 * uint8 [H,W,C], labels int64 scalars, and so on).
 *
 * A field may be *deferred*: recipe is set, tensor.buffer is NULL, and the
 * tensor header (dtype, ndim, shape, contiguous strides, offset 0) describes
 * the values the recipe will write.  Deferring lets the producer (augment)
 * write straight into the consumer's memory (a batch slot) instead of into a
 * per-sample allocation that is then copied.  Shape and dtype checks may read
 * the header as usual; any stage that reads tensor data must first call
 * sf_field_materialize(), or call recipe->write() into memory of its own.
 * Only decoded fields are deferred.  Batch fields are never deferred.
 */
typedef struct sf_field {
  char name[SF_FIELD_NAME_MAX]; /**< lower-case, as after the key's first dot */
  bool encoded;                 /**< still the bytes read from the shard */
  sf_tensor tensor;             /**< owned; buffer NULL while the field is deferred */
  sf_field_recipe *recipe;      /**< owned; non-NULL only while the field is deferred */
} sf_field;

/**
 * How a shard is to be read beyond its URL: whether pipe:COMMAND may run, the samples to keep (an elastic
 * resume's plan), the byte range of an indexed read. Private to the engine: set and read it with the
 * sf_shard_* functions below, never by layout.
 */
typedef struct sf_shard_reading sf_shard_reading;

/**
 * One shard to read, as handed from a source stage (shard_source) to a splitting stage (tar_split).
 * Owned by whoever holds the item; make it with sf_shard_new() and free it with sf_shard_destroy().
 */
typedef struct sf_shard {
  char *url;                    /**< owned copy */
  uint64_t epoch;               /**< 0-based epoch this shard is read for */
  uint64_t index;               /**< position in the expanded shard list */
  uint64_t pass;                /**< 0 for the first pass of an epoch, >0 for repeats */
  uint64_t samples_per_epoch;   /**< epoch length in samples for this rank, 0 = one pass */
  sf_shard_reading *reading;    /**< opaque, owned (made by sf_shard_new); NULL reads as the defaults: no pipe,
                                     every sample, the whole shard */
} sf_shard;

/**
 * A sample: the members of a shard that share a key (WebDataset's rule).
 * Owned by whoever holds the item; free with sf_sample_destroy().
 */
typedef struct sf_sample {
  char *key;                    /**< __key__: member path up to the first dot of its basename (or
                                     as tar_split's key_rule says), any length; owned, never NULL
                                     ("" until sf_sample_set_key()) */
  sf_buffer *url;               /**< __url__ as a NUL-terminated shared string (owned ref) */
  uint64_t epoch;               /**< 0-based epoch */
  uint64_t shard_index;         /**< index of the shard in the expanded list */
  uint64_t index;               /**< sample index within the shard (0-based) */
  uint64_t pass;                /**< the shard's pass (see sf_shard) */
  int64_t offset;               /**< byte offset of the sample's first member header */
  int n_fields;
  sf_field fields[SF_MAX_FIELDS];
} sf_sample;

/**
 * A batch: fields collated along a new leading axis of size `size`
 * (images float32 [B,C,H,W], labels int64 [B]), and the sample keys.
 * Free with sf_batch_destroy().
 *
 * How each field is collated (batch's options; docs/batches.md):
 * - fixed (default, decoded fields of one shape): NAME [B, ...], sample j's
 *   values at row j.  Encoded fields not listed below are left out.
 * - ragged (option `ragged`: encoded members such as txt/json/any bytes, or
 *   1-D decoded fields of any length): NAME holds every sample's values
 *   concatenated, 1-D of the field's dtype (uint8 for bytes), plus
 *   NAME.offsets int64 [B+1]: sample j is NAME[offsets[j] : offsets[j+1]].
 * - padded (option `pad: NAME=VALUE`, 1-D decoded fields): NAME [B, L] with
 *   L the batch's longest, filled with VALUE after each sample's end, plus
 *   NAME.length int32 [B].
 * sf_batch_sample_view() reads sample j's values in all three cases.
 */
typedef struct sf_batch {
  uint64_t epoch;               /**< 0-based epoch */
  uint64_t index;               /**< 0-based batch index within the epoch */
  int64_t size;                 /**< number of samples B */
  char **keys;                  /**< B keys, owned (NULL for a sample without one); read with sf_batch_key() */
  int n_fields;
  sf_field fields[SF_MAX_FIELDS];
  uint64_t *origins;            /**< 2*B, owned: row j's shard index in the expanded shard list at [2j] and
                                     its sample index within that shard at [2j+1]; read with sf_batch_origin() */
} sf_batch;

/** Creates a shard descriptor with a copy of url, its reading at the defaults. Returns NULL when out of memory. */
SF_API sf_shard *sf_shard_new(const char *url);
/** Frees *shard, with its reading, and sets it to NULL. NULL-safe. */
SF_API void sf_shard_destroy(sf_shard **shard);

/**
 * Lets the shard be a pipe:COMMAND URL (a shell command run by the reader), which a graph allows only when it
 * opted in (shard_source's allow_pipe). Returns 0, or SF_EINVAL for a shard not made by sf_shard_new().
 */
SF_API int sf_shard_set_allow_pipe(sf_shard *shard, bool allow);
/** True when the shard may be a pipe:COMMAND (sf_shard_set_allow_pipe); false for NULL. Pass it on as the
 *  reader's sf_shard_reader_options.allow_pipe (shardflow/shard_io.h). */
SF_API bool sf_shard_allow_pipe(const sf_shard *shard);

/**
 * Keeps only the samples whose 0-based index within the shard is among keep[0, n) (an elastic resume's plan,
 * shard_source's `plan`): the splitting stage drops the others. Takes keep (malloc'd, any order: sorted here;
 * NULL with n 0 keeps every sample again), also on failure. Returns 0, or SF_EINVAL for a shard not made by
 * sf_shard_new() (keep is then freed).
 */
SF_API int sf_shard_set_keep(sf_shard *shard, uint64_t *keep, size_t n);
/** True when the sample of index `index` (0-based within the shard) is to be emitted: every sample without a
 *  keep list (sf_shard_set_keep), else those on it. O(log n). */
SF_API bool sf_shard_keeps(const sf_shard *shard, uint64_t index);

/**
 * An indexed read: the byte range of a shard that holds whole samples, found in the shard's index
 * (shardflow/index.h), read instead of the whole shard.
 */
typedef struct sf_shard_range {
  int64_t offset;         /**< byte offset in the shard of the first sample's first member header */
  int64_t length;         /**< bytes to read from there (> 0): the samples' members, headers included */
  uint64_t first_sample;  /**< 0-based index within the shard of the range's first sample */
  uint64_t samples;       /**< whole samples the range holds */
  const char *etag;       /**< a remote shard's ETag when it was indexed (reads carry If-Match with it), or NULL /
                               "" (sf_shard_set_range copies it; sf_shard_range_of lends the shard's copy) */
  const char *index;      /**< the index file the range comes from, named when the shard changed since it was
                               indexed, or NULL (copied and lent as etag is) */
} sf_shard_range;

/**
 * Makes the shard an indexed read of *range (copied, its etag and index too). Returns 0; SF_EINVAL for a length < 1 or
 * a shard not made by sf_shard_new(); SF_ENOMEM (the shard is then unchanged).
 */
SF_API int sf_shard_set_range(sf_shard *shard, const sf_shard_range *range);
/**
 * True when the shard is an indexed read, with its range in *range (etag borrowed from the shard, NULL when
 * none); false for a whole shard (or NULL), *range then zeroed.
 */
SF_API bool sf_shard_range_of(const sf_shard *shard, sf_shard_range *range);

/** Creates an empty sample (zeroed, no fields). Returns NULL when out of memory. */
SF_API sf_sample *sf_sample_new(void);
/** Frees *sample, dropping every field's reference and recipe; sets it to NULL. NULL-safe. */
SF_API void sf_sample_destroy(sf_sample **sample);
/**
 * A sample held in as little memory as its fields need: its header and its n_fields fields, without the
 * unused slots up to SF_MAX_FIELDS (a sample struct is 2.7 KiB; one with two fields compacts to 400 bytes).
 * For a stage that holds many samples at once for a while, as shuffle's buffer does: 10,000 full structs
 * are 27 MiB of fresh memory that the kernel must zero before the first sample leaves. Opaque: read its
 * fields with sf_compact_sample_fields(), get the sample back with sf_compact_sample_expand().
 */
typedef struct sf_compact_sample sf_compact_sample;

/**
 * Moves *sample (key, URL, fields with their references and recipes) into a new compact sample and frees
 * the sample struct; *sample is set to NULL. Returns the compact sample, or NULL when out of memory
 * (*sample is then left as it was).
 */
SF_API sf_compact_sample *sf_sample_compact(sf_sample **sample);
/**
 * Moves *compact back into a sample (the same key, URL, fields, epoch and origin) and frees it; *compact is
 * set to NULL. Returns the sample, or NULL when out of memory (*compact is then left as it was).
 */
SF_API sf_sample *sf_compact_sample_expand(sf_compact_sample **compact);
/** The compact sample's fields (borrowed, *n_fields of them) and, when epoch is not NULL, its epoch in *epoch. */
SF_API const sf_field *sf_compact_sample_fields(const sf_compact_sample *compact, int *n_fields, uint64_t *epoch);
/** Frees *compact as sf_sample_destroy() frees a sample; sets it to NULL. NULL-safe. */
SF_API void sf_compact_sample_destroy(sf_compact_sample **compact);
/** Sets the sample's key to the len bytes at key (copied; keys have no length limit). Returns 0 or SF_ENOMEM. */
SF_API int sf_sample_set_key(sf_sample *sample, const char *key, size_t len);
/** Takes the sample's key (caller frees it; NULL when it had none), leaving "" behind. */
SF_API char *sf_sample_take_key(sf_sample *sample);
/** The sample's URL string, or "" when it has none (borrowed). */
SF_API const char *sf_sample_url(const sf_sample *sample);
/** The field called name, or NULL (borrowed). */
SF_API sf_field *sf_sample_field(sf_sample *sample, const char *name);
/**
 * Appends a field, taking over the reference in *tensor (zeroed on return,
 * success or failure).  Returns the new field, or NULL when the sample is full
 * (SF_MAX_FIELDS) or the name is too long.
 */
SF_API sf_field *sf_sample_add_field(sf_sample *sample, const char *name, bool encoded,
                                     sf_tensor *tensor);
/**
 * Makes field a deferred field (see sf_field) of the given dtype and shape
 * whose values recipe writes: drops the field's tensor reference and old
 * recipe, marks it decoded and takes ownership of recipe.  To append a
 * deferred field, add an empty tensor with sf_sample_add_field() first.
 * Returns 0, or SF_EINVAL for a bad dtype or shape (recipe is then
 * destroyed and the field left as it was).
 */
SF_API int sf_field_defer(sf_field *field, sf_dtype dtype, int ndim, const int64_t *shape,
                          sf_field_recipe *recipe);
/** Removes field i, dropping its reference (and destroying its recipe). */
SF_API void sf_sample_remove_field(sf_sample *sample, int i);

/**
 * Turns a deferred field into an ordinary one: allocates its tensor, runs the
 * recipe into it and destroys the recipe.  A no-op on a field that is not
 * deferred.  Returns 0, or SF_ENOMEM (the field is then still deferred).
 */
SF_API int sf_field_materialize(sf_field *field);

/**
 * Creates a batch for size samples with room for the keys. Returns NULL when
 * out of memory or size is negative.  Fields are added by the caller.
 */
SF_API sf_batch *sf_batch_new(int64_t size);
/** Frees *batch and its tensors' references; sets it to NULL. NULL-safe. */
SF_API void sf_batch_destroy(sf_batch **batch);
/** The field called name, or NULL (borrowed). */
SF_API const sf_field *sf_batch_field(const sf_batch *batch, const char *name);

/**
 * Sample j's values of batch field name, however it was collated (see
 * sf_batch): row j of a fixed field; NAME[offsets[j] : offsets[j+1]] of a
 * ragged one; row j cut to NAME.length[j] of a padded one.  *view is a
 * strided view sharing the batch's buffer (a new reference: release it with
 * sf_tensor_clear(); it stays valid after the batch is destroyed).
 * Returns 0, or SF_EINVAL when there is no such field, j is outside 0..B-1
 * or the offsets are inconsistent (*view is then zeroed).
 */
SF_API int sf_batch_sample_view(const sf_batch *batch, const char *name, int64_t j, sf_tensor *view);

/*
 * Accessors for bindings that do not mirror these structs (Python's ctypes):
 * the number of samples B, the epoch, the number of fields, field i's name
 * and sample j's key (borrowed strings; NULL when out of range).
 */
SF_API int64_t sf_batch_size(const sf_batch *batch);
SF_API uint64_t sf_batch_epoch(const sf_batch *batch);
SF_API int sf_batch_field_count(const sf_batch *batch);
SF_API const char *sf_batch_field_name(const sf_batch *batch, int i);
SF_API const char *sf_batch_key(const sf_batch *batch, int64_t j);
/**
 * Where row j of the batch was read: *shard_index is the shard's position in
 * shard_source's expanded list, *sample_index the sample's 0-based position in
 * that shard (tar_split's count).  Together they name a sample exactly, even
 * when keys repeat; Python's elastic resume records them.  Returns 0, or
 * SF_EINVAL when j is out of range.
 */
SF_API int sf_batch_origin(const sf_batch *batch, int64_t j, uint64_t *shard_index, uint64_t *sample_index);

#ifdef __cplusplus
}
#endif
#endif
