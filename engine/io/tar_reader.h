/* WebDataset samples from a tar stream: plain ustar members parsed here, the rest by libarchive's tar reader; .tar.gz and .tar.zst decompressed here, their checks verified. TFRecord shards (.tfrecord) read as records of tf.train.Example. */
#ifndef SF_ENGINE_TAR_READER_H
#define SF_ENGINE_TAR_READER_H

#include <regex.h>

#include "shard_reader.h"
#include "tfrecord.h"
#include "shardflow/sample.h"

typedef struct sf_tar_reader sf_tar_reader;

/*
 * Opens a shard for sample-by-sample reading (the shard is streamed, never
 * held whole). Returns 0 or the shard reader's error (see sf_shard_reader_open).
 */
int sf_tar_reader_open(sf_tar_reader **reader, const char *url,
                       const sf_shard_reader_options *options, sf_error *error);

/*
 * Reads the next sample with WebDataset's grouping rule: key = member path up
 * to the first dot of its last path component (or see sf_tar_reader_set_key_rule), field name = the rest,
 * lower-cased; only consecutive members with one key form a sample;
 * directories, non-regular members, metadata (a first path component that
 * starts and ends with "__": "__meta__", "__meta__/inner.json"; not
 * "__key__.txt") and names without a dot are skipped. Each field is an encoded uint8 [n] tensor
 * holding the member bytes in one allocation. key, url, index (0-based in the
 * shard) and offset (byte offset of the sample's first header) are set.
 *
 * Returns 0 with *sample (caller owns it); SF_EOF at the end of the shard;
 * SF_EDUP for a repeated field (the sample is still returned in *sample, minus
 * the duplicate, with *error describing it, and reading may go on);
 * SF_ETOOBIG likewise for a member over max_member_size, a sample over
 * max_sample_size (see sf_tar_reader_set_limits), a field name over 31 bytes
 * or more than SF_MAX_FIELDS fields; SF_EUNSUPPORTED likewise for a sparse
 * member; SF_ENOMEM likewise when a member's buffer cannot be allocated (in
 * all these the sample is returned without the offending members, whose bytes
 * are passed over and never held, and reading may go on: a caller tells them
 * from the errors below by *sample being set);
 * SF_EFORMAT for a corrupt or truncated tar (reading cannot go on); other
 * reader errors. *error names the URL and byte offset, and the key only when
 * the failure cut a sample (a member read in part): that sample is lost and
 * callers count it as skipped. Whole members before a damaged header still
 * form a sample, returned first; the failure comes with the next call.
 */
int sf_tar_reader_next(sf_tar_reader *reader, sf_sample **sample, sf_error *error);

/*
 * True when the reader has failed for good: the next sf_tar_reader_next() returns the failure.
 * Right after a sample was returned, it means the damage came before another key or the
 * shard's end showed that sample whole: whether members of it were lost is unknown.
 */
bool sf_tar_reader_failed(const sf_tar_reader *reader);

/*
 * Right after sf_tar_reader_next() returned a sample: the stream offset where the bytes after it
 * start (the next sample's first member header, or the archive's end-of-archive blocks), so that
 * [sample->offset, this) is the sample's span, the members passed over after it included (an
 * index, engine/io/shard_index.h). -1 when not known: after a failure, in a TFRecord shard.
 */
int64_t sf_tar_reader_next_offset(const sf_tar_reader *t);

/* Bytes taken from the shard so far (raw, before decompression): after SF_EOF, normally the shard's size. */
int64_t sf_tar_reader_source_bytes(const sf_tar_reader *t);

/*
 * True when sf_tar_reader_next() would not wait for a remote shard's bytes
 * (see sf_shard_reader_ready()): the bytes the next sample needs have
 * arrived, judged by the largest sample read so far in this shard (stream
 * bytes from its header to the next header; one readable chunk before the
 * first sample), or the download ended or is paused with full buffers.
 * A sample larger than every one before it may still wait for its remainder.
 * Always true for local files, pipes, memory, and after the end or a failure.
 */
bool sf_tar_reader_ready(sf_tar_reader *reader);

/*
 * Same as sf_tar_reader_open() over bytes already in memory (borrowed; they
 * must outlive the reader). url is only used in samples and messages. For
 * tests and fuzz targets. Returns 0 or SF_ENOMEM.
 */
int sf_tar_reader_open_memory(sf_tar_reader **reader, const void *data, size_t size,
                              const char *url, sf_error *error);

/*
 * Defaults of the limits below: tar_split's options table takes them as its
 * defaults, and shardflow ls applies them.
 */
#define SF_TAR_MAX_MEMBER_SIZE "256MiB"
#define SF_TAR_MAX_SAMPLE_SIZE "1GiB"

/*
 * Bounds what one sample may hold in memory: a member over max_member_size
 * bytes, or one that would take its sample over max_sample_size, is refused
 * (see sf_tar_reader_next). Readers start with the defaults above.
 */
void sf_tar_reader_set_limits(sf_tar_reader *reader, int64_t max_member_size, int64_t max_sample_size);

/* How a member path splits into sample key and field name (tar_split's key_rule). */
typedef enum sf_key_rule {
  SF_KEY_FIRST_DOT, /* WebDataset's rule: the key runs to the first dot of the basename (the default) */
  SF_KEY_LAST_DOT,  /* to the basename's last dot: "Track 2.0.mp3" -> key "Track 2.0", field "mp3" */
  SF_KEY_REGEX,     /* a POSIX regex's group 1, which must start the path and be followed by '.' and the
                       field; members it does not match are skipped, like names without a dot */
} sf_key_rule;

/*
 * Sets how member paths split into key and field (before the first sf_tar_reader_next). regex
 * (compiled with at least one group) is borrowed and must outlive the reader; it is only read with
 * SF_KEY_REGEX, which without one falls back to the first-dot rule. Field names are lower-cased
 * under every rule.
 */
void sf_tar_reader_set_key_rule(sf_tar_reader *reader, sf_key_rule rule, const regex_t *regex);

/*
 * True when url names a TFRecord shard: its name (an http(s) URL's up to its query) ends in .tfrecord or
 * .tfrecords, optionally followed by .gz or .zst (any case). Such a shard is read as TFRecord records, one
 * tf.train.Example each, instead of tar members: each record is one sample whose fields are its features
 * (see sf_tfrecord_parse_example), keyed by its index in the shard (decimal) or the feature set with
 * sf_tar_reader_set_tfrecord; index and offset are the record's, offsets counting the decompressed
 * stream. sf_tar_reader_next then returns, besides the errors above: SF_EFORMAT with an empty *sample for
 * a record whose data fails its CRC32C or is no Example, SF_ETOOBIG likewise for one over the smaller of
 * the two limits (passed over, never held), SF_EUNSUPPORTED, SF_EDUP or SF_ENOENT likewise for features
 * it cannot give (reading goes on after all these); SF_EFORMAT without a sample for a length whose CRC32C
 * fails or a shard cut inside a record (reading cannot go on).
 */
bool sf_tar_reader_is_tfrecord(const char *url);

/*
 * How a TFRecord shard's features become fields (see sf_tfrecord_options): the key feature and renames.
 * Copied, but the strings it points to are borrowed and must outlive the reader. Tar shards ignore it.
 */
void sf_tar_reader_set_tfrecord(sf_tar_reader *reader, const sf_tfrecord_options *options);

/* Closes and sets *reader to NULL. */
void sf_tar_reader_close(sf_tar_reader **reader);

#endif
