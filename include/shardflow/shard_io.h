/*
 * shardflow's shard I/O for stages: shard URLs and lists, downloads ahead (http(s), s3://, gs://, az://, hf://)
 * with retries, timeouts and a byte budget, a local cache of whole remote shards, the byte stream of one
 * shard (file, pipe or download), and the tar / TFRecord sample reader over it. The built-in shard_source and
 * tar_split stages are written against this header, and a plugin can call the same functions: a stage
 * splitting another container format reads a shard's bytes with sf_shard_reader_read() and keeps the
 * downloads, retries and cache that tar_split has.
 */
#ifndef SHARDFLOW_SHARD_IO_H
#define SHARDFLOW_SHARD_IO_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shardflow/error.h"
#include "shardflow/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- URLs and shard lists ---------------------------------------------------------------------- */

/** What a shard list entry names; the scheme is matched case-sensitively, as written in shard lists. */
typedef enum sf_url_kind {
  SF_URL_PATH,  /**< no scheme: a local path */
  SF_URL_FILE,  /**< file:// */
  SF_URL_HTTP,  /**< http:// or https:// */
  SF_URL_STORE, /**< s3://, gs://, az:// or hf:// (an object store) */
  SF_URL_PIPE,  /**< pipe:COMMAND (a shell command whose stdout is the shard) */
  SF_URL_OTHER, /**< another SCHEME:// that nothing here reads */
} sf_url_kind;

/** The kind of url (NULL is a path). Thread-safe. */
SF_API sf_url_kind sf_url_kind_of(const char *url);

/**
 * The local path a path or file:// URL names (file:///path and file://localhost/path, %XX decoded), malloc'd
 * (the caller frees it); NULL for other URLs, a file URL without an absolute path, or out of memory.
 */
SF_API char *sf_url_local_path(const char *url);

/** True for what is downloaded over the network: http://, https://, s3://, gs://, az://, hf://. */
SF_API bool sf_url_is_remote(const char *url);

/** URLs expanded from a shard list spec (sf_shard_list_expand). Free with sf_shard_list_clear(). */
typedef struct sf_shard_list {
  char **urls;  /**< count URLs in list order, each owned by the list (malloc'd) */
  size_t count; /**< number of URLs */
} sf_shard_list;

/**
 * Expands a shard list spec into URLs, in order, into *list (overwritten, not freed first). Several patterns are
 * joined with "::". Brace groups: {000000..000649} (the wider bound's zero padding kept), {a,b,c}; groups may
 * repeat and nest, expanded left to right as bash does. "@FILE" reads one URL (or pattern) per line from FILE
 * ('#' starts a comment). An s3:// or gs:// URL ending in '/' is a prefix: it expands to every .tar, .tar.gz,
 * .tgz and .tar.zst object under it, sorted by key (a listing request to the store); SF_ENOENT when there are
 * none, and the store's errors (SF_EDENIED, SF_ENET) as they come. Returns 0; SF_EINVAL with *error naming the
 * pattern and column; SF_ETOOBIG past 10,000,000 URLs; SF_ENOMEM (on failure the list is left empty). The
 * caller owns the list: sf_shard_list_clear().
 */
SF_API int sf_shard_list_expand(sf_shard_list *list, const char *spec, sf_error *error);

/** Frees the list's URLs and zeroes it. */
SF_API void sf_shard_list_clear(sf_shard_list *list);

/* ---- downloads ahead --------------------------------------------------------------------------- */

/**
 * A prefetcher: one thread driving every download of remote shards through one libcurl multi handle (so
 * connections to a server are reused from shard to shard). Downloads start in the order they were queued;
 * at most max_transfers run at once, and the bytes they hold unread stay under max_bytes (the download being
 * read may hold up to 2 MiB more, so it never waits on the ones ahead of it).
 *
 * Faults: an attempt that fails with HTTP 5xx, 429 or 408, a timeout, a reset, a refused connection or a
 * socket that could not be opened for want of file descriptors is retried after an exponential backoff
 * with jitter (Retry-After is honoured). When bytes had arrived, the retry asks for `Range: bytes=N-`
 * pinned to the first response's version (If-Match with its ETag, else If-Unmodified-Since), so the stream
 * goes on with the next byte; two versions of an object are never spliced (a 412 or another ETag fails the
 * download). A server whose shards keep failing the same hard way is taken as dead (dead_host_shards).
 */
typedef struct sf_prefetch sf_prefetch;

/** One shard's download, owned by whoever started it until sf_fetch_close() (or a reader took it). */
typedef struct sf_fetch sf_fetch;

/** One version of a remote object: the validators of the HTTP response that brought it (either may be empty). */
typedef struct sf_object_version {
  char etag[200];         /**< the ETag header's value as sent (quotes and W/ kept), NUL-terminated */
  char last_modified[64]; /**< the Last-Modified header's value (an HTTP date), NUL-terminated */
} sf_object_version;

/** How a prefetcher runs; a zeroed struct gives the defaults. Strings are copied. */
typedef struct sf_prefetch_options {
  int max_transfers;      /**< downloads running at once; 0 = 3 */
  int64_t max_bytes;      /**< bytes held for unread data over all downloads; 0 = 64 MiB */
  double connect_timeout; /**< seconds to connect to a server; 0 = 10 s */
  double stall_timeout;   /**< seconds under 1 byte/s before an attempt fails (and is retried); 0 = 30 s */
  int retries;            /**< retries after failures that brought no new byte; 0 = none */
  double retry_wait;      /**< seconds, the first backoff (doubles with each retry); 0 = 0.1 s */
  double retry_max_wait;  /**< seconds, the longest single wait (Retry-After included); 0 = 30 s */
  /**
   * Called (may be NULL) on the download thread, with no lock held, after bytes became readable or a download
   * ended, failed or began a backoff: a caller polling with sf_fetch_ready() (a step that must not block) is
   * told to look again (a stage passes a function calling sf_node_notify()).
   */
  void (*wake)(void *opaque);
  void *wake_opaque; /**< passed to wake (borrowed) */
  /**
   * A server that has served no shard yet and failed this many shards in a row the same hard way (connection
   * refused, a name that does not resolve, a TLS failure, HTTP 401 or 403) is dead: those downloads and every
   * later one from it fail at once with SF_EHOSTDOWN. Timeouts, resets, 5xx and 404 never count. 0 = never.
   */
  int dead_host_shards;
  const char *ca_file; /**< PEM file of the CAs trusted for https; NULL = the SSL_CERT_FILE variable, else the
                            system's */
} sf_prefetch_options;

/** Counters over a prefetcher's life (all its downloads). */
typedef struct sf_prefetch_stats {
  uint64_t shards;          /**< downloads started */
  uint64_t bytes;           /**< body bytes received */
  uint64_t refetched_bytes; /**< of those, bytes received a second time and discarded (a resume answered 200) */
  uint64_t retries;         /**< attempts made after a failure */
  uint64_t resumes;         /**< of those, attempts asking for a Range from a byte > 0 */
  uint64_t failed;          /**< downloads that failed for good */
  uint64_t not_modified;    /**< conditional downloads answered 304: the caller's cached copy is current */
  uint64_t completed;       /**< downloads that received their whole body (not the 304s) */
  uint64_t completed_bytes; /**< the body bytes of those: their mean is a shard's size */
  uint64_t held_bytes;      /**< bytes the blocks of every download hold now (a gauge, not a counter) */
} sf_prefetch_stats;

/**
 * Starts a prefetcher and its thread. options may be NULL (defaults). Returns 0; SF_ENET (libcurl did not
 * initialise), SF_EMFILE (out of file descriptors), SF_ENOMEM, with *error set. The caller owns *prefetch:
 * sf_prefetch_destroy().
 */
SF_API int sf_prefetch_new(sf_prefetch **prefetch, const sf_prefetch_options *options, sf_error *error);

/**
 * Stops the thread and frees the prefetcher; downloads not yet closed are closed too (their sf_fetch pointers
 * must not be used afterwards). Sets *prefetch to NULL. NULL-safe.
 */
SF_API void sf_prefetch_destroy(sf_prefetch **prefetch);

/** Copies the prefetcher's counters into *stats. Thread-safe. */
SF_API void sf_prefetch_stats_get(sf_prefetch *prefetch, sf_prefetch_stats *stats);

/**
 * Changes how many downloads run at once (< 1 is taken as 1) while the prefetcher runs: a tuner raising or
 * lowering the shards read ahead. Downloads running beyond a lowered count finish; no new one starts until
 * fewer run. Thread-safe.
 */
SF_API void sf_prefetch_set_max_transfers(sf_prefetch *prefetch, int max_transfers);

/**
 * The bytes a download of `bytes` body bytes holds against max_bytes once it is complete and unread: data
 * moves in blocks of 512 KiB, so a 20 KB shard holds one whole block. A tuner counts with it how many shards
 * the budget holds.
 */
SF_API int64_t sf_prefetch_footprint(int64_t bytes);

/**
 * Queues a download of url (sf_url_is_remote(); s3/gs/az/hf requests are signed anew for every attempt). It
 * starts as soon as fewer than max_transfers run. cached (may be NULL; copied) is the version of a copy the
 * caller holds (sf_shard_cache_lookup): the request is then conditional (If-None-Match, else
 * If-Modified-Since), and a 304 answer ends the download with no body. Returns 0 with *fetch (the caller owns
 * it: sf_fetch_close(), or hand it to a reader through sf_shard_reader_options.fetch); SF_EINVAL (not a
 * remote URL), SF_ENOMEM.
 */
SF_API int sf_prefetch_start(sf_prefetch *prefetch, const char *url, const sf_object_version *cached, sf_fetch **fetch,
                             sf_error *error);

/**
 * Queues a download of the bytes [offset, offset + length) of url (an indexed read of whole samples) with the
 * same retries as sf_prefetch_start(), resumed inside the range. if_match (may be NULL or empty; copied) is
 * the ETag the object must still have (its index's): an answer with another ETag, or a 412, fails the
 * download with SF_EIO ("changed since it was indexed"); a server that answers anything but 206 Partial
 * Content with these bytes fails it with SF_EUNSUPPORTED. Returns 0 with *fetch (owned by the caller:
 * sf_fetch_close()); SF_EINVAL (not a remote URL, length < 1), SF_ENOMEM.
 */
SF_API int sf_prefetch_start_range(sf_prefetch *prefetch, const char *url, int64_t offset, int64_t length,
                                   const char *if_match, sf_fetch **fetch, sf_error *error);

/**
 * The non-blocking check for callers that must not wait (a stage's step): true when the next sf_fetch_read()s
 * would not wait for `bytes` bytes (at least one): they are readable, or the download ended (cleanly or not:
 * the read reports it), or it is paused because its buffers are full (reading frees them). Marks fetch as
 * the one being read (it may then use the 2 MiB reserve). When it returns false, the options' wake hook is
 * called once something changes. Thread-safe.
 */
SF_API bool sf_fetch_ready(sf_fetch *fetch, int64_t bytes);

/**
 * True when the download has ended: every byte is received (or the server answered 304), or it failed for
 * good. Unlike sf_fetch_ready() it does not mark fetch as the one being read: a tuner may ask it of the
 * downloads ahead. Thread-safe.
 */
SF_API bool sf_fetch_done(sf_fetch *fetch);

/**
 * Returns the next bytes of the download: > 0 with *data pointing at them (borrowed, valid until the next
 * call or close), 0 at the end, or a negative SF_E* code (SF_ENOENT for 404/410, SF_ENET, SF_ETIMEDOUT,
 * SF_EDENIED, SF_EIO for a changed object, SF_EMFILE, SF_EHOSTDOWN for a dead server, SF_ECANCELED) once
 * every byte received before the failure was handed out, with *error naming the URL (credentials redacted),
 * the byte offset (counted from the first byte asked for) and what to do. Waits for bytes; cancelled (may be
 * NULL) is asked every ~100 ms meanwhile, and true ends the wait with SF_ECANCELED.
 */
SF_API ssize_t sf_fetch_read(sf_fetch *fetch, const void **data, bool (*cancelled)(void *opaque), void *cancel_opaque,
                             sf_error *error);

/** Ends the download (finished or not), frees what it holds and sets *fetch to NULL. NULL-safe. */
SF_API void sf_fetch_close(sf_fetch **fetch);

/* ---- the shard cache --------------------------------------------------------------------------- */

/**
 * A local cache of whole remote shards: a directory with a size cap and least-recently-used eviction, safe
 * when several processes share it (entries appear by rename(2), eviction runs under flock(2)). An entry is
 * served only once the server confirmed it current (a download made conditional on its version, answered
 * 304 Not Modified), so a shard replaced on the server is never read stale. A reader given the cache
 * (sf_shard_reader_options.cache) serves, revalidates and fills it.
 */
typedef struct sf_shard_cache sf_shard_cache;

/**
 * Opens (creating it and its parents) the cache directory dir with a cap of max_bytes (> 0) on its entries'
 * total size. Returns 0; SF_EINVAL (max_bytes <= 0, dir empty or too long); SF_EIO (the directory or its lock
 * file cannot be created or opened: the message names the path and the system's reason); SF_ENOMEM. The
 * caller owns *cache: sf_shard_cache_close(). Thread-safe once opened.
 */
SF_API int sf_shard_cache_open(sf_shard_cache **cache, const char *dir, int64_t max_bytes, sf_error *error);

/** Frees *cache (NULL is fine) and sets it to NULL; readers using it must have been closed. */
SF_API void sf_shard_cache_close(sf_shard_cache **cache);

/**
 * Looks url up: returns an open read-only fd (O_CLOEXEC, owned by the caller, positioned at the shard's first
 * byte) of the cached shard, its size in bytes in *size and its version in *version (either may be NULL); or
 * -1 when it is not cached (counted as a miss). The fd stays valid even if another process evicts the entry.
 * Serve it only once the server confirmed the version: pass version to sf_prefetch_start() and the fd and the
 * fetch to a reader (sf_shard_reader_options.cached_fd), which does so. Thread-safe.
 */
SF_API int sf_shard_cache_lookup(sf_shard_cache *cache, const char *url, int64_t *size, sf_object_version *version);

/** This process's counters of a cache since it was opened. */
typedef struct sf_shard_cache_stats {
  uint64_t hits;          /**< entries served: the server confirmed them current */
  uint64_t stale;         /**< entries the server had replaced: downloaded again */
  uint64_t misses;        /**< lookups that found no entry */
  uint64_t evicted_bytes; /**< bytes of the entries this process evicted */
} sf_shard_cache_stats;

/** Copies this process's counters since open into *stats. Thread-safe. */
SF_API void sf_shard_cache_stats_get(const sf_shard_cache *cache, sf_shard_cache_stats *stats);

/* ---- one shard's bytes ------------------------------------------------------------------------- */

/** The byte stream of one shard: a local file, a pipe:COMMAND's output or a download. */
typedef struct sf_shard_reader sf_shard_reader;

/** How a shard is opened (sf_shard_reader_open, sf_tar_reader_open); a zeroed struct gives the defaults. */
typedef struct sf_shard_reader_options {
  bool allow_pipe;        /**< pipe:COMMAND runs only when this is set (a graph's opt-in: sf_shard_allow_pipe) */
  double connect_timeout; /**< seconds to connect to a remote shard's server; 0 = 10 s */
  double stall_timeout;   /**< seconds without a byte before an attempt fails; 0 = 30 s */
  /** Retries after failures that brought no byte: remote shards', and any open, socket or pipe that failed
   *  for want of file descriptors (EMFILE, ENFILE: they pass as others close theirs). 0 = none. */
  int retries;
  double retry_wait;     /**< seconds, the first backoff (doubling); 0 = 0.1 s */
  double retry_max_wait; /**< seconds, the longest single wait; 0 = 30 s */
  const char *ca_file;   /**< https: PEM file of the CAs trusted (borrowed); NULL = SSL_CERT_FILE, else the system's */
  /** Remote shards: the download already started for this URL (handed over: the reader owns it from the call
   *  on, whatever the outcome), or NULL. */
  sf_fetch *fetch;
  /** Remote shards without fetch: the prefetcher to start the download on (borrowed; it must outlive the
   *  reader); NULL: the reader runs a prefetcher of its own with the settings above. */
  sf_prefetch *prefetch;
  /** Remote shards: a cache to read from and fill (borrowed, may be NULL). A shard not in it, or replaced on
   *  the server, is stored once it has been read to its end. */
  sf_shard_cache *cache;
  /** An fd of this shard from sf_shard_cache_lookup() (handed over like fetch), or -1 for none (a zeroed
   *  struct has 0: set -1 whenever cache is set); read only with cache, and fetch must then be a download made
   *  conditional on the cached version. The cached copy is read when the server answers 304. */
  int cached_fd;
  /** Asked every ~100 ms while a read waits (a pipe's output, the network): true ends the wait with
   *  SF_ECANCELED, so a stopping pipeline never waits on a hung source (a stage passes sf_node_cancelled). */
  bool (*cancelled)(void *opaque);
  void *cancel_opaque; /**< passed to cancelled (borrowed) */
  /** Local regular files: map the file (copy-on-write) instead of reading it, so that the tar reader hands
   *  out members as views of the mapping with no copy. A file truncated in place while mapped then raises
   *  SIGBUS on the lost pages: replace shards by renaming a new file over the old one. */
  bool mmap;
  /** Where to add the wall time, in nanoseconds, that reads of a local file or a pipe take (atomically, a
   *  relaxed __atomic_fetch_add: read it with __atomic_load_n from any thread), so that a report tells waiting
   *  for storage from the caller's CPU (borrowed; NULL: not timed). */
  uint64_t *read_ns;
} sf_shard_reader_options;

/**
 * Opens url (a path, file://, http(s)://, s3://, gs://, az://, hf:// or pipe:COMMAND) for sequential reading;
 * the shard is streamed, never held whole. Remote shards are downloaded, retried and resumed as sf_prefetch
 * says; messages show them with credentials redacted. Returns 0; SF_ENOENT (missing file, HTTP 404); SF_ENET
 * (unreachable host, other HTTP errors); SF_ETIMEDOUT; SF_EDENIED (pipe: without allow_pipe, a redirect to
 * another scheme); SF_EIO (the object changed while read); SF_EMFILE (out of file descriptors, still after
 * the retries: not a fault of the shard); SF_EHOSTDOWN (the shard's server is taken as dead); SF_EINVAL (bad
 * URL); SF_ECANCELED; SF_ENOMEM. On failure *error names the URL and what to do. options may be NULL;
 * options->fetch and options->cached_fd are consumed in every case. The caller owns *reader:
 * sf_shard_reader_close().
 */
SF_API int sf_shard_reader_open(sf_shard_reader **reader, const char *url, const sf_shard_reader_options *options,
                                sf_error *error);

/**
 * Returns the next chunk of the shard's bytes: > 0 bytes with *data pointing at them (borrowed, valid until
 * the next call), 0 at the end of the shard, or a negative SF_E* code (SF_EIO, SF_ENET, SF_ENOENT,
 * SF_ETIMEDOUT, SF_ECANCELED...) with *error naming the URL and the byte offset reached. May wait.
 */
SF_API ssize_t sf_shard_reader_read(sf_shard_reader *reader, const void **data, sf_error *error);

/**
 * True when sf_shard_reader_read() would not wait for the next `bytes` bytes (at least one): a remote shard's
 * download has them, or ended, or is paused with full buffers (the prefetcher's wake hook says when to ask
 * again). Always true for local files and pipes, which are read synchronously, and at the end.
 */
SF_API bool sf_shard_reader_ready(sf_shard_reader *reader, int64_t bytes);

/** Bytes delivered so far. */
SF_API int64_t sf_shard_reader_offset(const sf_shard_reader *reader);

/** Closes (kills and reaps a pipe's child, ends the download) and sets *reader to NULL. NULL-safe. */
SF_API void sf_shard_reader_close(sf_shard_reader **reader);

/* ---- samples from tar and TFRecord shards ------------------------------------------------------ */

/**
 * A shard read sample by sample. Tar shards: POSIX ustar members are parsed directly, other members (POSIX
 * pax extended headers, GNU tar long names and sparse files) by libarchive's tar reader; .tar.gz and
 * .tar.zst (also .tgz) are decompressed with their checks (gzip's CRC-32, zstd's checksum) verified. TFRecord
 * shards (sf_tar_reader_is_tfrecord): TensorFlow's framing (length, masked CRC-32C of it, data, masked CRC-32C
 * of the data), each record a tf.train.Example protocol buffer.
 */
typedef struct sf_tar_reader sf_tar_reader;

/**
 * Opens the shard url for sample-by-sample reading (through sf_shard_reader_open(), options as there; NULL:
 * defaults). Returns 0 or the shard reader's error. The caller owns *reader: sf_tar_reader_close().
 */
SF_API int sf_tar_reader_open(sf_tar_reader **reader, const char *url, const sf_shard_reader_options *options,
                              sf_error *error);

/**
 * Same as sf_tar_reader_open() over size bytes already in memory (borrowed: they must outlive the reader; a
 * tar needs its end-of-archive blocks, two 512-byte zero blocks, after the last member). url is only used in
 * samples and messages. Returns 0 or SF_ENOMEM.
 */
SF_API int sf_tar_reader_open_memory(sf_tar_reader **reader, const void *data, size_t size, const char *url,
                                     sf_error *error);

/**
 * Reads the next sample with WebDataset's grouping rule: key = the member path up to the first dot of its
 * last path component (or as sf_tar_reader_set_key_rule says), field name = the rest, lower-cased; only
 * consecutive members with one key form a sample; directories, non-regular members, metadata (a first path
 * component that starts and ends with "__", such as "__meta__/x.json"; not "__key__.txt") and names without a
 * dot are skipped. Each field is an encoded uint8 [n] tensor of the member's bytes. key, url, index (0-based
 * in the shard) and offset (byte offset of the sample's first member header) are set.
 *
 * Returns 0 with *sample (the caller owns it: sf_sample_destroy); SF_EOF at the end of the shard. Errors that
 * spoil one sample return it in *sample without the offending members (whose bytes are passed over, never
 * held) with *error describing them, and reading may go on: SF_EDUP (a repeated field), SF_ETOOBIG (a member
 * over max_member_size, a sample over max_sample_size, a field name over 31 bytes, more than SF_MAX_FIELDS
 * fields), SF_EUNSUPPORTED (a sparse member), SF_ENOMEM. Errors without a sample end the shard: SF_EFORMAT (a
 * corrupt or truncated tar) and the shard reader's errors. *error names the URL and byte offset, and the key
 * only when the failure cut a sample (a member read in part): that sample is lost (count it as skipped).
 * Whole members before a damaged header still form a sample, returned first; the failure comes with the next
 * call (sf_tar_reader_failed tells). TFRecord shards: see sf_tar_reader_is_tfrecord.
 */
SF_API int sf_tar_reader_next(sf_tar_reader *reader, sf_sample **sample, sf_error *error);

/**
 * True when the reader has failed for good: the next sf_tar_reader_next() returns the failure. Right after a
 * sample was returned, it means the damage came before another key or the shard's end showed that sample
 * whole: whether members of it were lost is unknown.
 */
SF_API bool sf_tar_reader_failed(const sf_tar_reader *reader);

/**
 * True when sf_tar_reader_next() would not wait for a remote shard's bytes (sf_shard_reader_ready): the bytes
 * the next sample needs have arrived, judged by the largest sample so far in this shard, or the download
 * ended or is paused with full buffers. A sample larger than every one before it may still wait. Always true
 * for local files, pipes, memory, and after the end or a failure.
 */
SF_API bool sf_tar_reader_ready(sf_tar_reader *reader);

/** Default of tar_split's max_member_size (sf_tar_reader_set_limits), as an option value. */
#define SF_TAR_MAX_MEMBER_SIZE "256MiB"
/** Default of tar_split's max_sample_size (sf_tar_reader_set_limits), as an option value. */
#define SF_TAR_MAX_SAMPLE_SIZE "1GiB"

/**
 * Bounds what one sample may hold in memory, in bytes: a member over max_member_size, or one that would take
 * its sample over max_sample_size, is refused (see sf_tar_reader_next). Readers start with the defaults above.
 */
SF_API void sf_tar_reader_set_limits(sf_tar_reader *reader, int64_t max_member_size, int64_t max_sample_size);

/** How a member path splits into sample key and field name (tar_split's key_rule). */
typedef enum sf_key_rule {
  SF_KEY_FIRST_DOT, /**< WebDataset's rule: the key runs to the first dot of the basename (the default) */
  SF_KEY_LAST_DOT,  /**< to the basename's last dot: "Track 2.0.mp3" -> key "Track 2.0", field "mp3" */
  SF_KEY_REGEX,     /**< a POSIX regex's group 1, which must start the path and be followed by '.' and the
                         field; members it does not match are skipped, like names without a dot */
} sf_key_rule;

/**
 * Sets how member paths split into key and field (before the first sf_tar_reader_next). regex (compiled with
 * regcomp(), with at least one group) is borrowed and must outlive the reader; it is only read with
 * SF_KEY_REGEX, which without one falls back to the first-dot rule. Field names are lower-cased under every rule.
 */
SF_API void sf_tar_reader_set_key_rule(sf_tar_reader *reader, sf_key_rule rule, const regex_t *regex);

/**
 * True when url names a TFRecord shard: its name (an http(s) URL's up to its query) ends in .tfrecord or
 * .tfrecords, optionally followed by .gz or .zst (any case). Such a shard is read as records, one
 * tf.train.Example each: each record is one sample whose fields are its features (a bytes_list of one value
 * as encoded uint8 [n]; an int64_list as int64 and a float_list as float32, a scalar for one value, 1-D
 * otherwise), keyed by its index in the shard (decimal) or the feature sf_tar_reader_set_tfrecord names;
 * offsets count the decompressed stream. sf_tar_reader_next then also returns, with a sample left empty and
 * reading going on: SF_EFORMAT for a record whose data fails its CRC-32C or is no Example, SF_ETOOBIG for one
 * over the smaller limit, SF_EUNSUPPORTED, SF_EDUP or SF_ENOENT for features it cannot give; and SF_EFORMAT
 * without a sample for a length whose CRC-32C fails or a shard cut inside a record (reading cannot go on).
 */
SF_API bool sf_tar_reader_is_tfrecord(const char *url);

/** How a TFRecord shard's features become fields (tar_split's tfrecord_key and tfrecord_fields). */
typedef struct sf_tfrecord_options {
  const char *key_feature;   /**< the feature (one bytes or int64 value) that keys each sample and is no field; a
                                  record without it is refused. NULL or "" = the record's index (borrowed) */
  const char *const *fields; /**< n_fields items "FIELD=FEATURE": that feature becomes field FIELD (borrowed) */
  int n_fields;              /**< number of items in fields */
} sf_tfrecord_options;

/**
 * Sets how a TFRecord shard's features become fields (before the first sf_tar_reader_next). *options is
 * copied, but the strings it points to are borrowed and must outlive the reader. Tar shards ignore it.
 */
SF_API void sf_tar_reader_set_tfrecord(sf_tar_reader *reader, const sf_tfrecord_options *options);

/** Closes the reader (and its shard reader) and sets *reader to NULL. NULL-safe. */
SF_API void sf_tar_reader_close(sf_tar_reader **reader);

#ifdef __cplusplus
}
#endif
#endif
