/* shardflow stage API: what a built-in stage or a plugin implements (libavfilter's AVFilter, in spirit). */
#ifndef SHARDFLOW_STAGE_H
#define SHARDFLOW_STAGE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shardflow/log.h"
#include "shardflow/pool.h"
#include "shardflow/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Version of sf_stage_def's layout. The plugin loader refuses any other.
 * 3: the `map` callback and named port lists (`inputs`, `outputs`) replaced `input`, `output`.
 * 4: the `stats` callback (sf_stage_stats, sf_worker_stats); sf_float_list holds SF_FLOAT_LIST_MAX numbers (was 8);
 *    an input port list may end in a template row ("in%u").
 * 5: sf_shard's reading instructions (allow_pipe, keep, the indexed range) moved behind its opaque `reading`
 *    pointer and the sf_shard_* accessors (sample.h).
 */
#define SF_STAGE_ABI_VERSION 5

/** What a port carries. */
typedef enum sf_port_kind {
  SF_PORT_NONE = 0, /**< no port (a source has no input) */
  SF_PORT_SHARD,    /**< sf_shard */
  SF_PORT_SAMPLE,   /**< sf_sample */
  SF_PORT_BATCH,    /**< sf_batch */
} sf_port_kind;

/** Most input ports one node may have connected: the graph file's `inputs:` names at most this many stages. */
#define SF_NODE_INPUTS_MAX 64

/**
 * One named port of a stage: a row of its `inputs` or `outputs` list.  A list
 * ends with a row whose kind is SF_PORT_NONE ({0}); a NULL list has no ports
 * (a source has no input, a sink no output).  A single port may be unnamed
 * (NULL) or named "in" / "out"; names matter once a stage has several ports
 * (fan-in, e.g. mixing datasets: the graph file's `inputs:` connects a stage's
 * input ports in order, read with sf_node_pop_port(); fan-out, several output
 * ports, is refused when the graph is built).
 *
 * A last input row whose name contains "%u" is a template (GStreamer's request pads,
 * `sink_%u`): it stands for as many ports as `inputs:` names, up to SF_NODE_INPUTS_MAX,
 * numbered from 0 in place of the "%u" (`{"in%u", SF_PORT_SAMPLE}`: in0, in1, ...), each
 * of its kind; the rows before it are fixed ports.  sf_port_name_at() gives a port's name.
 * Static data of the stage, borrowed by the engine.
 */
typedef struct sf_port_def {
  const char *name;  /**< port name in graph files ("in", "images"); NULL for the single default port */
  sf_port_kind kind; /**< what it carries; SF_PORT_NONE ends the list */
} sf_port_def;

/**
 * A port list literal for C stage definitions, ended for you:
 * `.inputs = SF_PORTS({"in", SF_PORT_SAMPLE})`.  (C only: C++ has no compound
 * literals; write a static array ending with {NULL, SF_PORT_NONE} instead.)
 */
#define SF_PORTS(...) ((const sf_port_def[]){__VA_ARGS__, {NULL, SF_PORT_NONE}})

/** Number of rows in a list (0 for NULL; a template row counts once: sf_port_capacity() counts ports). */
SF_API int sf_port_count(const sf_port_def *ports);

/** Ports of a list that can be connected: its rows, or SF_NODE_INPUTS_MAX when its last row is a template. */
SF_API int sf_port_capacity(const sf_port_def *ports);

/** Kind of port number `port` (0-based; a template's ports have its kind), SF_PORT_NONE past the list's capacity. */
SF_API sf_port_kind sf_port_kind_at(const sf_port_def *ports, int port);

/**
 * Writes the name of port number `port` into buf (cut to size bytes with a NUL): the row's name, "" for an
 * unnamed one, a template's with the port's number in place of "%u" ("in%u", port 3: "in3").  Returns the
 * name's full length as snprintf does, or -1 past the list's capacity.
 */
SF_API int sf_port_name_at(const sf_port_def *ports, int port, char *buf, size_t size);

/** Kind of a list's first port (the one sf_node_pop and sf_node_push use), SF_PORT_NONE when it has none. */
SF_API sf_port_kind sf_port_first_kind(const sf_port_def *ports);

/** What one queue slot holds. */
typedef enum sf_item_kind {
  SF_ITEM_NONE = 0,  /**< empty (also: a sample dropped by a replica, skipped by the engine) */
  SF_ITEM_SHARD,
  SF_ITEM_SAMPLE,
  SF_ITEM_BATCH,
  SF_ITEM_EPOCH_END, /**< marks the end of epoch `epoch`: flush, then pass it on */
} sf_item_kind;

/** An item travelling along an edge.  Pushing it hands its pointer over. */
typedef struct sf_item {
  sf_item_kind kind;
  uint64_t epoch;
  union {
    sf_shard *shard;
    sf_sample *sample;
    sf_batch *batch;
  } u;
} sf_item;

/** Frees whatever the item holds and sets kind to SF_ITEM_NONE. */
SF_API void sf_item_clear(sf_item *item);

/** Bytes of the tensors a sample or batch item holds (deferred fields count as their output); 0 otherwise. */
SF_API size_t sf_item_nbytes(const sf_item *item);

/** Option value types; the storage type at `offset` in the stage's private struct. */
typedef enum sf_option_type {
  SF_OPT_BOOL,       /**< bool: true/false/yes/no/on/off/1/0 */
  SF_OPT_INT,        /**< int64_t, range-checked against [min,max] */
  SF_OPT_COUNT,      /**< int64_t >= 0; accepts 10k, 2M, 1_000 */
  SF_OPT_FLOAT,      /**< double, range-checked */
  SF_OPT_STRING,     /**< char * (engine-owned, freed after uninit) */
  SF_OPT_ENUM,       /**< int: index into enum_names */
  SF_OPT_SIZE,       /**< int64_t bytes: 512, 64k, 64KiB, 16MiB, 1G (k=1000, Ki=1024) */
  SF_OPT_DURATION,   /**< double seconds: 250ms, 30s, 5m, 1h, plain number = seconds */
  SF_OPT_SEED,       /**< uint64_t */
  SF_OPT_FLOAT_LIST, /**< sf_float_list: "0.1,0.2,0.3" or a YAML list */
  SF_OPT_NAME_LIST,  /**< sf_name_list: "jpg,png", "[jpg, png]" or a YAML list (engine-owned, freed after uninit) */
} sf_option_type;

/** Most numbers an SF_OPT_FLOAT_LIST option holds: as many as a node may have inputs (a mix's weights). */
#define SF_FLOAT_LIST_MAX SF_NODE_INPUTS_MAX

/** Storage of an SF_OPT_FLOAT_LIST option: v[0 .. n). A stage that takes fewer checks n itself. */
typedef struct sf_float_list {
  int n;
  double v[SF_FLOAT_LIST_MAX];
} sf_float_list;

/** Most items an SF_OPT_NAME_LIST option holds. */
#define SF_NAME_LIST_MAX 64

/**
 * Storage of an SF_OPT_NAME_LIST option: the items of a list written as "a,b,c", "[a, b, c]" or a YAML list
 * (flow or block), in order, each without the blanks around it; empty items ("a,,b", a trailing comma) are
 * left out.  An item is any text without a comma ("image=jpg;png", "ids=0"): what it means is the stage's
 * to check.  At most SF_NAME_LIST_MAX items.  The engine owns v (one allocation with the strings) and frees it
 * after uninit; n is 0 and v NULL for an empty list.
 */
typedef struct sf_name_list {
  int n;               /**< number of items */
  const char *const *v; /**< the items: v[0] .. v[n - 1], NUL-terminated */
} sf_name_list;

/**
 * One row of a stage's options table.  The same row parses the graph file,
 * checks ranges, prints `shardflow help STAGE` and writes the docs.  The
 * default is written as text and parsed by the same parser as user values.
 * A table ends with a row whose name is NULL.
 */
typedef struct sf_option {
  const char *name;                /**< snake_case key in the graph file */
  sf_option_type type;
  size_t offset;                   /**< offsetof(private struct, field) */
  const char *default_value;       /**< text form; NULL = zero / empty */
  double min, max;                 /**< inclusive range for INT/COUNT/FLOAT/SIZE/DURATION (min==max: unchecked) */
  const char *help;                /**< one sentence, with the unit */
  const char *const *enum_names;   /**< NULL-terminated names for SF_OPT_ENUM */
} sf_option;

/** Flags of a stage definition. */
enum {
  /**
   * One sample in, at most one out, no state between samples: may run as `replicas: N`. Where the graph
   * file does not write `replicas`, the plan gives such a stage one replica per CPU of the process's
   * budget (output never depends on the count: replicas keep the samples' order).
   */
  SF_STAGE_MAP = 1u << 0,
  /**
   * The stage can leave fields undecoded as deferred fields (sf_field_defer with a recipe of its own) for
   * a consumer that does better with them, e.g. a JPEG whose crop is decoded later. It does so only where
   * sf_node_may_defer() says the plan allows it (or an option of its own forces it).
   */
  SF_STAGE_MAKES_DEFERRED = 1u << 1,
  /**
   * The stage takes deferred fields and turns every one it receives into data itself (a corrupt one
   * becomes its error record, not black pixels), so a producer just before it in the same process may
   * defer (see SF_STAGE_MAKES_DEFERRED). augment is one: it decodes only what its crop keeps. A plugin
   * stage does the same with codec.h (sf_image_decode_deferred, sf_image_transform_apply); one that only
   * materialises what it receives (sf_field_materialize) turns a corrupt JPEG into black pixels and a log
   * line instead: set this flag there only where that is acceptable.
   */
  SF_STAGE_TAKES_DEFERRED = 1u << 2,
  /** The stage lends its producer the rows of its batch buffers (sf_node_lend_rows): batch. The plan says so. */
  SF_STAGE_LENDS_ROWS = 1u << 3,
  /** The stage writes its output into rows its consumer lends where it can (sf_node_borrow_row): augment. */
  SF_STAGE_BORROWS_ROWS = 1u << 4,
};

typedef struct sf_node sf_node;

/** Most options a stage reports as tuned while it runs (sf_stage_stats.tuned). */
#define SF_STAGE_TUNED_MAX 4

/** An option a stage tunes while it runs (autotune: tar_split's prefetch), as its stats callback reports it. */
typedef struct sf_stage_tuned {
  const char *option; /**< the option's name, static storage ("prefetch") */
  int64_t value;      /**< in force now */
  int64_t initial;    /**< what the run started with: the default, or the value written */
  bool pinned;        /**< the graph (or --set, or the API) wrote it: the stage leaves it as it is */
  uint64_t changes;   /**< times the stage changed it */
  double changed_at;  /**< seconds since the pipeline started at the last change; 0 when it never changed */
} sf_stage_tuned;

/**
 * What a stage reports about itself beyond the counters every node has (items, bytes, busy and wait time,
 * errors, its own sf_node_counter_add counters), through its definition's `stats` callback: shown in
 * `shardflow run`'s stage table, sf_node_stats.stage (`--stats-json`, Python's stats()), /metrics
 * (docs/metrics.md) and used by the bottleneck line (docs/bottleneck.md).  Each part is set only when its
 * flag is; the engine zero-fills the struct before the call.
 */
typedef struct sf_stage_stats {
  bool reads;                /**< a shard reader (tar_split), remote shards or not: read_ns is set */
  uint64_t read_ns;          /**< wall time its steps spent in reads of shard bytes (read() of a file or pipe,
                                  the page faults of a mapped shard): storage, not its CPU */
  bool reader;               /**< a shard reader with downloads started: the next five are set */
  uint64_t downloaded_bytes; /**< body bytes received over the network */
  uint64_t refetched_bytes;  /**< of which were received a second time and discarded */
  uint64_t retries;          /**< download attempts after a failure */
  uint64_t cache_hits;       /**< shards served from the shard cache */
  uint64_t prefetch;         /**< downloads ahead in force now (the reader's `prefetch`) */
  bool group;                /**< a group's head (the node named after the group): the next seven are set */
  uint64_t workers;          /**< workers alive now */
  uint64_t reassigned;       /**< units handed to another worker after theirs died, left or was late */
  uint64_t duplicates;       /**< results dropped because their unit was already done */
  uint64_t malformed;        /**< messages dropped as malformed or not matching their unit */
  uint64_t refused;          /**< connections refused by authentication */
  uint64_t ring_bytes;       /**< result payload bytes local processes passed through shared memory */
  uint64_t socket_bytes;     /**< result payload bytes that came through the sockets */
  int n_tuned;               /**< entries of tuned[] set */
  sf_stage_tuned tuned[SF_STAGE_TUNED_MAX]; /**< the options the stage tunes while it runs, pinned ones included */
} sf_stage_stats;

/** Most stages of one worker's table (sf_worker_stats.stages). */
#define SF_WORKER_STAGES_MAX 64

/** One stage of a worker's pipeline, as the worker last reported it. */
typedef struct sf_worker_stage_stats {
  char name[32];        /**< the node's name */
  uint64_t items;       /**< items produced */
  uint64_t bytes;       /**< payload bytes produced */
  double busy_seconds;  /**< wall-clock seconds inside its steps */
  double wait_seconds;  /**< wall-clock seconds it waited for input */
  uint64_t errors;      /**< error records raised */
} sf_worker_stage_stats;

/** One worker of a group, alive or gone, as its head knows it (a stage's stats callback, sf_pipeline_workers). */
typedef struct sf_worker_stats {
  char name[64];        /**< the worker's name (`shardflow worker --name`, or HOST-PID) */
  int64_t pid;          /**< its process id on its host */
  bool live;            /**< alive now */
  uint64_t samples;     /**< samples of results taken from it */
  uint64_t units;       /**< work units taken from it */
  double rate;          /**< samples per second over the last second or so (0 once gone) */
  int n_stages;         /**< entries of stages[] set */
  sf_worker_stage_stats stages[SF_WORKER_STAGES_MAX]; /**< its own pipeline's nodes */
} sf_worker_stats;

/**
 * A stage definition: one `const` struct per stage, exported by its file.
 *
 * The engine allocates priv_size zeroed bytes, applies the options (defaults
 * first, then the graph file, then --set overrides) into them, then calls
 * init.  uninit is always called, even when init failed, so init never cleans
 * up after itself.
 *
 * A stage has either step or map (the plugin loader refuses both or neither).
 *
 * step performs one non-blocking unit of work: take what input is available
 * with sf_node_pop(), push at most a few items with sf_node_push().  The
 * engine only calls step when the output queue has room for one item.
 * Returns 0 after progress, SF_EAGAIN when it needs input that is not there
 * yet, SF_EOF when it will never produce again, or a negative error (the
 * pipeline stops with the node's last error record).
 *
 * map serves a stage of one sample in and at most one out: the engine pops,
 * passes epoch markers on, calls map once per sample, pushes the result and
 * counts it (sf_node_count_output: one item, sf_item_nbytes bytes).  map owns
 * *sample during the call and may change it in place or replace it (freeing
 * the old one); on return *sample is a sample or NULL, and the engine owns it.
 * Returns 0 to pass *sample on, or 0 with *sample set to NULL to drop it on
 * purpose (a filter: the engine frees nothing more and counts it as filtered,
 * not as an error, and not toward max_errors / max_error_rate).
 * A bad sample: report it with sf_node_error(), then return that error's code
 * (not sf_node_error's result): the engine drops the sample and, under the
 * graph's `skip` policy, counts it as skipped and goes on; under `fail` the
 * pipeline stops.  A negative return without an error record (out of memory
 * that is not the sample's fault) stops the pipeline under either policy.
 * A positive return is a bug in the stage: the engine drops the sample and
 * records an SF_EINVAL error naming the stage and the code, which then follows
 * the policy like a bad sample (skip: counted, fail: the pipeline stops).
 * A dropped sample still keeps replicas in order (the engine leaves a hole).
 */
typedef struct sf_stage_def {
  uint32_t abi_version;           /**< SF_STAGE_ABI_VERSION */
  const char *name;               /**< stage type in graph files */
  const char *summary;            /**< one line for `shardflow help` */
  const sf_port_def *inputs;      /**< input ports (see sf_port_def); NULL for a source */
  const sf_port_def *outputs;     /**< output ports; NULL for a stage that consumes everything */
  uint32_t flags;                 /**< SF_STAGE_* */
  size_t priv_size;
  const sf_option *options;       /**< NULL-name-terminated; may be NULL */
  int (*init)(sf_node *node);
  int (*step)(sf_node *node);     /**< one non-blocking unit of work; NULL when map is set */
  int (*map)(sf_node *node, sf_sample **sample); /**< one sample in, at most one out; NULL when step is set */
  void (*uninit)(sf_node *node);
  /**
   * What the stage reports beyond the common counters (sf_stage_stats), or NULL for nothing.  Fills *stats
   * (zeroed by the engine); a stage that hands work to other processes (a group's head) also fills
   * workers[0 .. max_workers) (workers may be NULL when max_workers is 0) and returns how many workers it
   * knows (may exceed max_workers); others return 0.  Called after a successful init and before uninit,
   * from any thread while the node runs (the /metrics server's, the trainer's), so it reads only state
   * that is safe to read there (atomics, or the stage's own lock).
   */
  int (*stats)(sf_node *node, sf_stage_stats *stats, sf_worker_stats *workers, int max_workers);
} sf_stage_def;

/** The stage's private struct (zeroed, then options applied). Borrowed. */
SF_API void *sf_node_priv(sf_node *node);

/** The node's name in the graph file ("decode"). Borrowed. */
SF_API const char *sf_node_name(const sf_node *node);

/**
 * The object the embedding program gave this node with sf_graph_attach (shardflow.h) before the
 * pipeline was built, or NULL when it gave none.  What it is, is a contract between the program and
 * the stage (the python stage takes an sf_handoff, shardflow/handoff.h); the engine only carries it.
 * Borrowed: the program keeps it alive while the pipeline runs; a stage that keeps it past init takes
 * its own reference where the object has one.
 */
SF_API void *sf_node_attachment(const sf_node *node);

/**
 * True when the plan lets this node's output carry deferred fields: the stage is SF_STAGE_MAKES_DEFERRED and
 * its one consumer, in the same process, is SF_STAGE_TAKES_DEFERRED (`shardflow run --explain` shows the
 * choice). False otherwise, and always under the test harness.
 */
SF_API bool sf_node_may_defer(const sf_node *node);

/**
 * Lent rows, the consumer's side: a stage that stacks each sample's fields row by row into buffers of
 * `rows` rows (batch) lends those rows to the producers feeding its input, so that a producer writes a
 * field's values straight into the row where they will be stacked, on its own thread, while they are in
 * its cache (sf_node_borrow_row). The slabs come from pool (borrowed: keep it alive while the pipeline
 * runs; pinned when it is). The stage learns nothing new: a row that arrives where its batch is being
 * filled, right after the rows before it, needs no copy, and any other row is copied as usual. So lending
 * never changes a batch, only where its bytes are first written. Call it from init. Returns 0 or SF_ENOMEM.
 */
SF_API int sf_node_lend_rows(sf_node *node, sf_pool *pool, int64_t rows);

/**
 * Lent rows, the consumer's side: the sample popped last goes to row `at` (0-based) of the batch being
 * filled. When its lent row lies elsewhere (a sample was dropped upstream, or a batch ended short at an
 * epoch's end), the rows start afresh at the first batch past where the producers have got to. Call it for
 * every sample popped and put in a batch at once; nothing for a sample held back.
 */
SF_API void sf_node_row_placed(sf_node *node, int64_t at);

/**
 * Lent rows, the producer's side: for the output this node makes next (in a map, the sample it was given),
 * the row its consumer lends for a field of this dtype and shape (the output's place in the stream, holes
 * of dropped samples counted, names the row). *row becomes a C-contiguous view of it (the caller's
 * reference: write the values, then make it the field's tensor, or clear it). Ask at most once per output,
 * before pushing it, and for one field of it. Returns 1 when a row was lent; 0 when none is (no lending
 * consumer, another process, a shape other than the first row's, a sample far behind the others, no memory
 * for a new slab): use memory of the stage's own then.
 */
SF_API int sf_node_borrow_row(sf_node *node, sf_dtype dtype, int ndim, const int64_t *shape, sf_tensor *row);

/**
 * True when the graph file, a --set override or the API wrote `option` for this node; false when it has
 * its default (and always under the test harness). A stage that tunes an option while it runs (autotune)
 * leaves a written value as it is: a value written pins it.
 */
SF_API bool sf_node_option_written(const sf_node *node, const char *option);

/** This replica's index in [0, replicas) and the replica count. */
SF_API int sf_node_replica(const sf_node *node);
SF_API int sf_node_replicas(const sf_node *node);

/**
 * A 64-bit seed for this node, mixed from the graph seed and the node name,
 * so two nodes of one graph never share a random stream.
 */
SF_API uint64_t sf_node_seed(const sf_node *node);

/**
 * The seed sf_node_seed() gives the node called name in this node's graph (name need not exist): for a stage
 * that replays another node's seeded draws (shard_source feeding a mix by position). name: NUL-terminated.
 */
SF_API uint64_t sf_node_seed_named(const sf_node *node, const char *name);

/**
 * Epochs of the whole run, counted from epoch 0 (0 = until stopped): the
 * pipeline runs epochs first_epoch .. epochs-1, so a resumed run ends where
 * the uninterrupted one would.
 */
SF_API uint64_t sf_node_epochs(const sf_node *node);

/** First epoch to run (0 unless the pipeline was told to start later). */
SF_API uint64_t sf_node_first_epoch(const sf_node *node);

/**
 * Batches of the first epoch that were already consumed before a resumption:
 * the batch stage rebuilds their sample stream but neither fills nor emits them.
 */
SF_API uint64_t sf_node_first_step(const sf_node *node);

/**
 * Rank and world size of the pipeline: from the API or the standard
 * environment (RANK/WORLD_SIZE from torchrun), else 0 and 1.
 */
SF_API int sf_node_rank(const sf_node *node);
SF_API int sf_node_world_size(const sf_node *node);

/**
 * Takes the next input item without waiting.
 * Returns 0 with *item filled (the caller now owns it), SF_EAGAIN when nothing
 * is queued yet, SF_EOF when the input is closed and drained.
 * A SF_STAGE_MAP stage never sees SF_ITEM_EPOCH_END (the engine forwards it).
 */
SF_API int sf_node_pop(sf_node *node, sf_item *item);

/**
 * Number of connected input ports: 0 for a source, 1 for a chain stage, the length of the graph
 * file's `inputs:` list for a stage that merges branches (fan-in, e.g. mix).
 */
SF_API int sf_node_input_count(const sf_node *node);

/**
 * Like sf_node_pop(), from input port `port` (0-based, the order of the graph file's `inputs:`;
 * port 0 is what sf_node_pop() reads).  Each port passes its own SF_ITEM_EPOCH_END markers: one
 * per epoch once every replica feeding that port has ended it.  Returns 0 with *item filled (the
 * caller owns it), SF_EAGAIN when nothing is queued on that port yet, SF_EOF when the port is
 * closed and drained, or is not connected.
 */
SF_API int sf_node_pop_port(sf_node *node, int port, sf_item *item);

/**
 * Adds items to the count of what came in on input port `port` (shown per input by `shardflow run`'s
 * stage table and in sf_node_stats.input_items); ports 0 .. SF_NODE_INPUTS_MAX - 1.
 */
SF_API void sf_node_count_input(sf_node *node, int port, uint64_t items);

/**
 * Hands item to the output queue.  Always consumes: on return item->kind is
 * SF_ITEM_NONE.  Never blocks; the engine bounds queues by only stepping a
 * node whose output has room, so push at most a few items per step.
 */
SF_API void sf_node_push(sf_node *node, sf_item *item);

/** True when the output queue has room for another item this step. */
SF_API bool sf_node_output_ready(const sf_node *node);

/**
 * Records an error against this node: counts it, stores the record (stage
 * name filled in), prints it to stderr (the first 20 records of a pipeline;
 * the rest are counted), and applies the graph's error policy.  url, key may be NULL; offset may be -1.
 * Returns 0 when the policy is `skip` (drop the sample and go on), or code
 * when it is `fail` (return it from step).
 */
SF_API int sf_node_error(sf_node *node, int code, const char *url, const char *key,
                         int64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/**
 * Records a mistake in the node's options, found in init (a value its own parser does not take, two options that
 * contradict each other), and returns SF_EOPTION whatever the graph's error policy: a stage cannot run with
 * options it refuses, so `return sf_node_option_error(node, "mean", "...")` ends init.  The record (SF_EOPTION,
 * the node's name as its stage) is counted and printed as sf_node_error()'s are; its message is "option
 * OPTION: " and fmt's text, or fmt's text alone when option is NULL (a problem of several options, or of the
 * node's wiring).  Say what to write instead.  Returns SF_EOPTION.
 */
SF_API int sf_node_option_error(sf_node *node, const char *option, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/**
 * Writes one log line about this node through the library's log handler (shardflow/log.h), as the engine
 * writes its own lines about a node: the default handler prints "shardflow: NAME: message" to stderr
 * ("shardflow: error: NAME: ..." for SF_LOG_ERROR), and a handler set with sf_log_set_handler() receives the
 * node's name as its stage.  level: an sf_log_level (another value is logged as SF_LOG_WARNING), with
 * SF_LOG_UNPREFIXED or-ed in for a line without the "shardflow: " prefix ("NAME: message"); fmt:
 * printf-style, one line without a trailing newline (cut at 4 KiB).  A line is neither counted nor limited:
 * log a condition once (e.g. the first time), not per sample, and report a bad sample or option with
 * sf_node_error() / sf_node_option_error() instead, which count it and apply the error policy.
 * Any thread (the handler runs on it).
 */
SF_API void sf_node_log(const sf_node *node, sf_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/**
 * Seconds since the node's pipeline started (a monotonic clock): when a stage changed something it tunes
 * (sf_stage_tuned.changed_at).  0 outside a pipeline (a stage run by the test harness).  Any thread.
 */
SF_API double sf_node_elapsed(const sf_node *node);

/**
 * Seconds the trainer has spent so far waiting inside sf_pipeline_next() for batches (the consumer's wait, a
 * monotonic total): a stage that tunes its read-ahead compares its own waits with it.  Negative outside a
 * pipeline (the test harness has no trainer).  Any thread.
 */
SF_API double sf_node_trainer_wait(const sf_node *node);

/** Most counters of its own a node may keep (sf_node_counter_add). */
#define SF_NODE_COUNTERS 4
/** Size of a counter name with its NUL: names have at most 31 bytes. */
#define SF_COUNTER_NAME_MAX 32

/**
 * Adds delta to the node's own counter `name` (something the stage counts beyond items, bytes, errors,
 * skipped and filtered: values clamped, tokens cut, retries), creating it at its first call: call it with
 * delta 0 in init to show the counter as 0 from the start.  Counters are shown with the node's other
 * counts, summed over its replicas: in `shardflow run`'s stage table (a line "NAME VALUE" under the node's
 * row), in sf_node_stats' counter_names / counters (`--stats-json` and Python's stats() as "counters":
 * {NAME: VALUE}), and per replica in /metrics as shardflow_stage_counter_total{stage, type, replica,
 * counter="NAME"}.  A node in a group's worker keeps its counters in the worker: the head shows only its own
 * nodes'.
 *
 * name: 1..31 bytes of a-z, 0-9 and _, starting with a letter; copied.  A node has at most SF_NODE_COUNTERS
 * names.  Returns 0; SF_EINVAL for a name not of that form, SF_ETOOBIG for a name beyond the first
 * SF_NODE_COUNTERS (nothing is counted either way: check the result in init).  Any thread; cheap (an atomic
 * add once the name is known).
 */
SF_API int sf_node_counter_add(sf_node *node, const char *name, uint64_t delta);

/**
 * Counts samples dropped because of an error (reported at the end; they count
 * toward the graph's max_errors / max_error_rate budget).
 */
SF_API void sf_node_count_skipped(sf_node *node, uint64_t samples);

/**
 * Counts samples a stage dropped on purpose (a filter; a map stage's NULL
 * result is counted for it): shown as "filtered" in the stage table and
 * sf_node_stats, not an error, outside the error budget.
 */
SF_API void sf_node_count_filtered(sf_node *node, uint64_t samples);

/**
 * Tells the pipeline that the sample stream of `epoch` is complete (called by
 * the stage that cuts epochs at samples_per_epoch).  The shard source reads
 * it with sf_node_epochs_closed() to stop producing shards for that epoch.
 * A node on a branch (before a stage that merges several inputs, e.g. mix)
 * closes the epoch for its branch only; the merging stage and those after it
 * close it for every branch.
 */
SF_API void sf_node_close_epoch(sf_node *node, uint64_t epoch);

/** Number of epochs closed so far with sf_node_close_epoch() (0 at start). */
SF_API uint64_t sf_node_epochs_closed(const sf_node *node);

/**
 * True once the pipeline is stopping (destroyed, or failed elsewhere): a
 * stage that still waits inside step() on I/O (it should rather return
 * SF_EAGAIN and be woken with sf_node_notify()) gives up and returns.
 */
SF_API bool sf_node_cancelled(const sf_node *node);

/**
 * Wakes the executor to step this node (and the others) again: for a step
 * that returned SF_EAGAIN because work arrived from outside its input queue
 * (bytes of a download, a socket, another thread of the program: see
 * shardflow/handoff.h), called by whatever thread learns it.  Without it, a
 * node that made no progress is only retried when another node makes some, or
 * after at most 100 ms.  Any thread, never blocks on I/O, cheap when no worker
 * sleeps.  The node must still exist: stop calling it from the stage's uninit
 * at the latest.
 */
SF_API void sf_node_notify(sf_node *node);

/** Adds to the node's metrics: items and bytes it produced. */
SF_API void sf_node_count_output(sf_node *node, uint64_t items, uint64_t bytes);

/**
 * Mixes 64-bit words into a seed (splitmix64 finaliser over each word).
 * Stages derive per-epoch and per-sample random streams from it so results do
 * not depend on thread scheduling.
 */
SF_API uint64_t sf_seed_mix(uint64_t seed, uint64_t word);

/** A small fast PRNG (xoshiro256**, Blackman & Vigna 2018) for stages. */
typedef struct sf_rng {
  uint64_t s[4];
} sf_rng;

/** Seeds rng from one 64-bit seed (expanded with splitmix64). */
SF_API void sf_rng_seed(sf_rng *rng, uint64_t seed);
/** Next 64 random bits. */
SF_API uint64_t sf_rng_next(sf_rng *rng);
/** Uniform integer in [0, n) without modulo bias; 0 when n is 0. */
SF_API uint64_t sf_rng_below(sf_rng *rng, uint64_t n);
/** Uniform double in [0, 1). */
SF_API double sf_rng_double(sf_rng *rng);

/**
 * Iterates the stage definitions: the built-in ones, then those of the plugins loaded so far (a
 * graph's `plugins:`), in load order; *opaque starts as NULL. Returns NULL at the end. Thread-safe;
 * the definitions are borrowed for the life of the process (plugins are never unloaded).
 */
SF_API const sf_stage_def *sf_stage_iterate(void **opaque);
/** Finds a stage definition by name among built-in and loaded plugins' stages, or NULL. Borrowed. */
SF_API const sf_stage_def *sf_stage_find(const char *name);

#ifdef __cplusplus
}
#endif
#endif
