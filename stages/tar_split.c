/* tar_split: streams each shard (file, http(s), s3, gs, pipe) through libarchive (or as TFRecord records) and emits its samples one per step, downloading the next shards meanwhile. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shardflow/shard_io.h"
#include "shardflow/stage.h"

/* Most shards read ahead; most ranges of shards (order: global / block over the network) read ahead. */
enum { LOOKAHEAD_MAX = 64, RANGES_AHEAD = 128, QUEUE = RANGES_AHEAD + 1 };

/*
 * The prefetch tuner (when the graph does not write `prefetch`): every WINDOW seconds it compares the share of
 * the window the reader waited for the bytes of the shard it splits (its download was not far enough ahead)
 * with the share the trainer waited for batches. Both above RAISE_SHARE: one more shard ahead, while the
 * shards the memory budget holds allow it. Downloads ahead found complete and unread at every shard change
 * (two or more: one fewer would still have been in time) with no wait, for lower_after windows in a row: one
 * fewer, never under 1; a lowering that a raise undoes doubles lower_after (hysteresis). The first window is
 * the start-up's (every pipeline waits for its first shard) and only sets the clocks.
 */
static const double WINDOW = 0.5;
static const double RAISE_SHARE = 0.10;
static const double QUIET_SHARE = 0.02;
enum { LOWER_AFTER = 4, LOWER_AFTER_MAX = 64, CLOCK_EVERY = 64 };

/* An input item taken ahead of its turn, with the download started for it. */
typedef struct ahead {
  sf_item item;
  sf_fetch *fetch;   /* remote shard: its download (owned), or NULL */
  int cache_fd;      /* the shard from the cache (owned), or -1 */
} ahead;

typedef struct tar_split {
  double connect_timeout; /* option, seconds */
  double stall_timeout;   /* option, seconds */
  int64_t prefetch;       /* option: remote shards downloaded ahead of the one being split */
  int64_t prefetch_bytes; /* option: bytes those downloads may hold */
  int64_t retries;        /* option */
  double retry_wait;      /* option, seconds */
  double retry_max_wait;  /* option, seconds */
  int64_t dead_host_shards; /* option: 0 = off */
  char *ca_file;          /* option, or NULL */
  char *cache_dir;        /* option, or NULL */
  int64_t cache_size;     /* option, bytes */
  int64_t max_member_size; /* option, bytes */
  int64_t max_sample_size; /* option, bytes */
  int key_rule;           /* option: sf_key_rule */
  char *key_regex;        /* option */
  char *tfrecord_key;     /* option, or NULL */
  sf_name_list tfrecord_fields; /* option: FIELD=FEATURE items */
  bool mmap;              /* option */
  uint64_t read_ns;       /* time the shard reads took (sf_shard_reader_options.read_ns; __atomic), for describe() */
  regex_t regex;          /* key_regex compiled, when compiled is set */
  bool compiled;
  sf_prefetch *downloads; /* one multi handle and thread for every remote shard; NULL until needed */
  sf_shard_cache *cache;
  ahead queue[QUEUE]; /* items taken from the input, in order (a ring) */
  int q_head, q_len, q_shards;
  bool input_done;        /* the input said SF_EOF */
  bool downloads_failed;  /* the prefetcher could not start: do not try again */
  sf_tar_reader *tar;     /* the open shard, or NULL */
  sf_shard *shard;        /* its descriptor (owned) */
  sf_shard_range span;    /* its range when it is an indexed read (sf_shard_range_of), else length 0 */
  bool started;           /* an epoch has been seen */
  uint64_t epoch;         /* epoch of the shards being read */
  uint64_t emitted;       /* samples emitted in that epoch */
  bool cut;               /* an epoch was ended at samples_per_epoch ... */
  uint64_t cut_epoch;     /* ... this one: shards of it or older are dropped */
  uint64_t pass;          /* pass of the shards being read, within the epoch */
  uint64_t pass_samples;  /* samples that pass yielded so far */
  /* The fields of the last sample emitted: a sample the damage follows must have them all (see whole_enough). */
  char ref_fields[SF_MAX_FIELDS][SF_FIELD_NAME_MAX];
  int n_ref_fields;       /* -1 until a sample was emitted */
  /* The prefetch tuner (see WINDOW), run from the steps. prefetch, changes and changed_ms are also read by
   * describe() on other threads: written with atomic stores. */
  bool tune;              /* prefetch is not written: tuned while running */
  int64_t prefetch_initial;
  uint64_t changes;       /* times the tuner changed prefetch */
  int64_t changed_ms;     /* milliseconds since the pipeline started at the last change */
  double window_start;    /* monotonic seconds; 0 until the first remote shard is opened */
  double waited;          /* seconds of this window spent waiting for a download's bytes */
  double waiting_since;   /* such a wait began then (monotonic seconds), or 0 */
  double trainer_start;   /* the trainer's wait (sf_pipeline_trainer_wait) at the window's start */
  int complete_min;       /* fewest downloads ahead found complete at a shard change this window; -1: no change */
  int quiet;              /* windows in a row without waits and with downloads ahead to spare */
  double quiet_seconds;   /* their length */
  int lower_after;        /* such windows before one shard fewer */
  bool lowered;           /* the last change was a lowering */
  bool warm;              /* the start-up window has passed */
  bool capped_said;       /* the memory budget stopped a raise, and the log said so */
  unsigned clock_steps;   /* steps since the clock was last read */
  /* Indexed reads (sf_shard_range_of): the bytes of the open range (with end-of-archive blocks
   * after them, for the tar reader over memory), and the last shard's file, kept open for the next range. */
  uint8_t *range;
  int range_fd;           /* -1 when none */
  bool ranged;            /* remote ranges were read ahead: RANGE_TRANSFERS at once, many items ahead */
  char *range_url;        /* the URL range_fd reads */
} tar_split;

static const char *const key_rule_names[] = {"first_dot", "last_dot", "regex", NULL};

static const sf_option options[] = {
    {"connect_timeout", SF_OPT_DURATION, offsetof(tar_split, connect_timeout), "10s", 0.001,
     86400, "longest wait for an http(s) connection to a shard's server, in seconds", NULL},
    {"stall_timeout", SF_OPT_DURATION, offsetof(tar_split, stall_timeout), "30s", 1, 86400,
     "abandon a download attempt of a remote shard that brings no byte for this long (then "
     "retried, resuming at the byte reached), in seconds", NULL},
    {"prefetch", SF_OPT_COUNT, offsetof(tar_split, prefetch), "2", 0, LOOKAHEAD_MAX,
     "remote shards (http, https, s3, gs) downloaded ahead while one is split, all on one "
     "thread and connection pool; 0 = one at a time. Default: tuned while running from 2 (raised while the "
     "reader and the trainer wait for downloads, within prefetch_bytes; lowered while downloads ahead sit "
     "unread); a written value pins it", NULL},
    {"prefetch_bytes", SF_OPT_SIZE, offsetof(tar_split, prefetch_bytes), "64MiB", 1 << 20,
     (double)(1LL << 40), "most bytes the downloads ahead may hold before they pause, in bytes", NULL},
    {"retries", SF_OPT_INT, offsetof(tar_split, retries), "5", 0, 1000,
     "retries of a remote shard after a 5xx, 429, timeout or reset (an attempt that brought new "
     "bytes starts the count again); a broken download resumes at the byte reached. Also of any "
     "shard's open that found no free file descriptor: still failing then, it stops the run (not skipped)", NULL},
    {"retry_wait", SF_OPT_DURATION, offsetof(tar_split, retry_wait), "100ms", 0.001, 3600,
     "first wait before a retry, in seconds; doubles with each retry, with jitter", NULL},
    {"retry_max_wait", SF_OPT_DURATION, offsetof(tar_split, retry_max_wait), "30s", 0.001, 86400,
     "longest wait before one retry, in seconds; a server asking (Retry-After) for longer fails "
     "the shard", NULL},
    {"dead_host_shards", SF_OPT_COUNT, offsetof(tar_split, dead_host_shards), "3", 0, 1000,
     "a server that has served no shard yet and failed this many shards in a row the same way (connection "
     "refused, host name not resolved, TLS failure, HTTP 401 or 403) is taken as dead: the run stops at "
     "once with one message, whatever error_policy says, instead of retrying and reporting every shard. "
     "Timeouts, resets, 5xx and 404 never count. 0 = off", NULL},
    {"ca_file", SF_OPT_STRING, offsetof(tar_split, ca_file), NULL, 0, 0,
     "PEM file of the certificate authorities trusted for https shards, in place of the system's (a "
     "server with a private CA); empty = the SSL_CERT_FILE variable, else the system's CAs", NULL},
    {"cache_dir", SF_OPT_STRING, offsetof(tar_split, cache_dir), NULL, 0, 0,
     "directory keeping whole remote shards for later epochs and runs (shared safely between "
     "processes); a cached shard is read once the server confirms it is current (a conditional "
     "GET answered 304), a replaced one is downloaded again; empty = no cache", NULL},
    {"cache_size", SF_OPT_SIZE, offsetof(tar_split, cache_size), "10GiB", 1 << 20, (double)(1LL << 50),
     "cap on cache_dir, in bytes; least recently used shards are evicted", NULL},
    {"max_member_size", SF_OPT_SIZE, offsetof(tar_split, max_member_size), SF_TAR_MAX_MEMBER_SIZE, 1,
     (double)(1LL << 40),
     "largest tar member held in memory, in bytes: a sample with a larger one gets an error record "
     "and is skipped (the member's bytes are passed over, never held) and the shard goes on. Sparse "
     "members are always refused", NULL},
    {"max_sample_size", SF_OPT_SIZE, offsetof(tar_split, max_sample_size), SF_TAR_MAX_SAMPLE_SIZE, 1,
     (double)(1LL << 40),
     "most bytes the members of one sample may hold, in bytes; a larger sample is skipped like an "
     "oversized member. With the queues' lengths this bounds a pipeline's memory", NULL},
    {"key_rule", SF_OPT_ENUM, offsetof(tar_split, key_rule), "first_dot", 0, 0,
     "how a member name splits into sample key and field: first_dot (WebDataset's rule: the key "
     "runs to the first dot of the basename), last_dot (to its last dot, for names holding dots such "
     "as \"Track 2.0.mp3\") or regex (key_regex's group 1)", key_rule_names},
    {"key_regex", SF_OPT_STRING, offsetof(tar_split, key_regex), NULL, 0, 0,
     "with key_rule: regex, a POSIX extended regular expression matched against the member path as stored (case kept): "
     "group 1, starting the path, is the key, and a dot and the field name follow it (\"^([^.]*[.][0-9]+)[.](.+)$\" splits "
     "\"Track 2.0.json.gz\" into Track 2.0 and json.gz); members it does not match are skipped", NULL},
    {"tfrecord_key", SF_OPT_STRING, offsetof(tar_split, tfrecord_key), NULL, 0, 0,
     "TFRecord shards (.tfrecord, .tfrecord.gz, .tfrecord.zst): the tf.train.Example feature (one bytes or "
     "int64 value) whose value keys each sample, and is no field; a record without it gets an error record "
     "and is skipped; empty = the record's index in its shard", NULL},
    {"tfrecord_fields", SF_OPT_NAME_LIST, offsetof(tar_split, tfrecord_fields), "", 0, 0,
     "TFRecord shards: FIELD=FEATURE items naming the field a feature becomes (\"jpg=image/encoded\": decode "
     "picks the decoder by a field's extension); features not listed keep their key as field name", NULL},
    {"mmap", SF_OPT_BOOL, offsetof(tar_split, mmap), "true", 0, 0,
     "memory-map local uncompressed shards and hand out their members as views of the page cache (no copy); "
     "a shard truncated in place while mapped then kills the process with SIGBUS (replace shards by renaming a "
     "new file over the old one); false reads them with read(), where a cut shows as a truncated member", NULL},
    {NULL},
};

/* ---- items taken ahead ---- */

static ahead *q_at(tar_split *t, int i) { return &t->queue[(t->q_head + i) % QUEUE]; }

static void ahead_clear(ahead *a) {
  sf_fetch_close(&a->fetch);
  if (a->cache_fd >= 0) close(a->cache_fd);
  a->cache_fd = -1;
  sf_item_clear(&a->item);
}

static int ensure_downloads(sf_node *node, tar_split *t, const char *url);

/*
 * Indexed reads of remote shards (order: global / block) are one small request each: they need many under way
 * at once, not the few whole shards the tuner weighs, so the first one sets this many transfers (and RANGES_AHEAD
 * items ahead) and stops the tuner; prefetch_bytes still bounds what they hold (a range holds one 512 KiB block).
 */
enum { RANGE_TRANSFERS = 64 };

/* Starts fetching a remote shard taken ahead: from the cache, else a download; a range of one: that range. */
static void start_ahead(sf_node *node, tar_split *t, ahead *a) {
  const char *url = a->item.u.shard->url;
  if (t->prefetch == 0 || !sf_url_is_remote(url)) return; /* local files: the page cache */
  sf_shard_range range;
  if (sf_shard_range_of(a->item.u.shard, &range)) {
    if (ensure_downloads(node, t, url) == 0) {
      if (!t->ranged) {
        t->ranged = true;
        t->tune = false;
        sf_prefetch_set_max_transfers(t->downloads, RANGE_TRANSFERS);
      }
      sf_error error;
      (void)sf_prefetch_start_range(t->downloads, url, range.offset, range.length, range.etag, &a->fetch,
                                    &error); /* on failure: at its turn */
    }
    return;
  }
  /* A cached copy is read only once the server confirms it (304 to a conditional download). */
  sf_object_version version;
  if (t->cache) a->cache_fd = sf_shard_cache_lookup(t->cache, url, NULL, &version);
  if (ensure_downloads(node, t, url) == 0) {
    sf_error error;
    (void)sf_prefetch_start(t->downloads, url, a->cache_fd >= 0 ? &version : NULL, &a->fetch,
                            &error); /* on failure: at its turn */
  }
}

/* The download thread's hook: bytes arrived or a download ended, so a step that found nothing can go on. */
static void wake(void *node) { sf_node_notify(node); }

/*
 * The downloads' thread and connection pool, started with the first remote
 * shard. Returns 0, or SF_ENOMEM (recorded; shards then download on their own).
 */
static int ensure_downloads(sf_node *node, tar_split *t, const char *url) {
  if (t->downloads) return 0;
  if (t->downloads_failed) return SF_ENOMEM;
  {
    sf_prefetch_options o = {
        .max_transfers = (int)t->prefetch + 1,
        .max_bytes = t->prefetch_bytes,
        .connect_timeout = t->connect_timeout,
        .stall_timeout = t->stall_timeout,
        .retries = (int)t->retries,
        .retry_wait = t->retry_wait,
        .retry_max_wait = t->retry_max_wait,
        .wake = wake,
        .wake_opaque = node,
        .dead_host_shards = (int)t->dead_host_shards,
        .ca_file = t->ca_file,
    };
    sf_error error;
    sf_prefetch *downloads;
    if (sf_prefetch_new(&downloads, &o, &error) < 0) {
      t->downloads_failed = true; /* each shard then downloads on its own when its turn comes */
      sf_node_error(node, error.code, url, NULL, -1, "cannot start downloads ahead: %s", error.message);
      return error.code;
    }
    __atomic_store_n(&t->downloads, downloads, __ATOMIC_RELEASE); /* read by describe() on other threads */
  }
  return 0;
}

/* Takes input items ahead (up to `prefetch` shards) and starts their downloads. Returns how many it took. */
static int fill_ahead(sf_node *node, tar_split *t) {
  int taken = 0;
  while (!t->input_done && t->q_len < QUEUE &&
         t->q_shards < (t->ranged ? RANGES_AHEAD : t->prefetch) + (t->tar ? 0 : 1)) {
    ahead *a = q_at(t, t->q_len);
    *a = (ahead){.cache_fd = -1};
    int rc = sf_node_pop(node, &a->item);
    if (rc == SF_EOF) t->input_done = true;
    if (rc < 0) return taken;
    taken++;
    if (a->item.kind == SF_ITEM_SHARD && t->cut && a->item.epoch <= t->cut_epoch) {
      sf_item_clear(&a->item); /* the epoch already has its samples_per_epoch samples */
      continue;
    }
    t->q_len++;
    if (a->item.kind == SF_ITEM_SHARD) {
      t->q_shards++;
      start_ahead(node, t, a);
    }
  }
  return taken;
}

/* ---- the prefetch tuner ---- */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The trainer's wait so far (0 under the test harness, which has none: sf_node_trainer_wait < 0). */
static double trainer_wait(sf_node *node) {
  double waited = sf_node_trainer_wait(node);
  return waited > 0 ? waited : 0;
}

static void set_prefetch(sf_node *node, tar_split *t, int64_t value) {
  __atomic_store_n(&t->prefetch, value, __ATOMIC_RELAXED);
  sf_prefetch_set_max_transfers(t->downloads, (int)value + 1);
  __atomic_store_n(&t->changes, t->changes + 1, __ATOMIC_RELAXED);
  int64_t ms = (int64_t)(sf_node_elapsed(node) * 1000); /* 0 under the test harness */
  __atomic_store_n(&t->changed_ms, ms > 0 ? ms : 1, __ATOMIC_RELAXED);
}

/*
 * One shard more ahead, when the memory budget holds it: prefetch_bytes must hold the complete downloads of
 * prefetch + 1 shards (their blocks: sf_prefetch_footprint of the mean shard so far) and, beside what the
 * downloads hold now, one shard more. Returns true when it raised.
 */
static bool raise_prefetch(sf_node *node, tar_split *t, double waited, double trainer, double window) {
  if (t->prefetch >= LOOKAHEAD_MAX) return false;
  sf_prefetch_stats s;
  sf_prefetch_stats_get(t->downloads, &s);
  if (s.completed == 0) return false; /* no shard's size known yet */
  int64_t shard = (int64_t)(s.completed_bytes / s.completed), footprint = sf_prefetch_footprint(shard);
  int64_t holds = t->prefetch_bytes / footprint;
  if (t->prefetch + 1 > holds || (int64_t)s.held_bytes + footprint > t->prefetch_bytes) {
    if (!t->capped_said)
      sf_node_log(node, SF_LOG_INFO,
                  "prefetch stays %lld although the reader waited for downloads %.0f%% of the last %.1f s: "
                  "prefetch_bytes (%.1f MiB) holds %lld shard(s) of %.1f MiB in blocks; raise prefetch_bytes for "
                  "more downloads ahead", (long long)t->prefetch, waited * 100, window,
                  (double)t->prefetch_bytes / 1048576.0, (long long)(holds > 0 ? holds : 0),
                  (double)footprint / 1048576.0);
    t->capped_said = true;
    return false;
  }
  sf_node_log(node, SF_LOG_INFO,
              "prefetch %lld -> %lld (waited for downloads %.0f%% of the last %.1f s, the trainer for batches %.0f%%)",
              (long long)t->prefetch, (long long)t->prefetch + 1, waited * 100, window, trainer * 100);
  set_prefetch(node, t, t->prefetch + 1);
  return true;
}

/* Judges the window that ends at `at` (see WINDOW) and starts the next one. */
static void tune_window(sf_node *node, tar_split *t, double at) {
  double len = at - t->window_start;
  if (t->waiting_since > 0) { /* a wait still going on: its part so far belongs to this window */
    t->waited += at - t->waiting_since;
    t->waiting_since = at;
  }
  double trainer_now = trainer_wait(node);
  double waited = t->waited / len;
  /* Under the test harness there is no trainer: the reader's own wait decides. */
  double trainer = sf_node_trainer_wait(node) >= 0 ? (trainer_now - t->trainer_start) / len : waited;
  if (trainer > 1) trainer = 1; /* a wait that began in the window before is counted when it ends */
  int complete_min = t->complete_min;
  t->window_start = at;
  t->waited = 0;
  t->trainer_start = trainer_now;
  t->complete_min = -1;
  if (!t->warm) {
    t->warm = true;
    return;
  }
  if (waited >= RAISE_SHARE && trainer >= RAISE_SHARE) {
    t->quiet = 0;
    t->quiet_seconds = 0;
    if (raise_prefetch(node, t, waited, trainer, len) && t->lowered) {
      t->lowered = false; /* the lowering was one too many: wait longer before the next */
      t->lower_after = t->lower_after * 2 < LOWER_AFTER_MAX ? t->lower_after * 2 : LOWER_AFTER_MAX;
    }
    return;
  }
  if (waited >= QUIET_SHARE || complete_min == 0 || complete_min == 1) {
    t->quiet = 0;
    t->quiet_seconds = 0;
    return;
  }
  if (complete_min < 0) return; /* no shard change in this window (large shards): nothing learnt */
  t->quiet_seconds += len;
  if (++t->quiet < t->lower_after || t->prefetch <= 1) return;
  sf_node_log(node, SF_LOG_INFO,
              "prefetch %lld -> %lld (no wait for downloads in the last %.1f s, and at every shard change 2 or more "
              "downloads ahead were complete and unread)", (long long)t->prefetch, (long long)t->prefetch - 1,
              t->quiet_seconds);
  set_prefetch(node, t, t->prefetch - 1);
  t->quiet = 0;
  t->quiet_seconds = 0;
  t->lowered = true;
}

static bool tuning(const tar_split *t) { return t->tune && t->downloads && t->window_start > 0; }

/* The step cannot go on until a download's bytes arrive. */
static void download_wait(sf_node *node, tar_split *t) {
  if (!tuning(t)) return;
  double at = now();
  if (t->waiting_since == 0) t->waiting_since = at;
  if (at - t->window_start >= WINDOW) tune_window(node, t, at);
}

/*
 * The step goes on (bytes there, or nothing remote to wait for): ends a wait, and reads the clock now and then,
 * and at every shard change (shard_change).
 */
static void download_go(sf_node *node, tar_split *t, bool shard_change) {
  if (!tuning(t)) return;
  if (t->waiting_since == 0 && !shard_change && ++t->clock_steps < CLOCK_EVERY) return;
  t->clock_steps = 0;
  double at = now();
  if (t->waiting_since > 0) {
    t->waited += at - t->waiting_since;
    t->waiting_since = 0;
  }
  if (at - t->window_start >= WINDOW) tune_window(node, t, at);
}

/* At a shard change: how many of the shards taken ahead have their download complete (the tuner's "to spare"). */
static void count_complete(tar_split *t) {
  if (!tuning(t)) return;
  int complete = 0;
  for (int i = 0; i < t->q_len; i++) {
    ahead *a = q_at(t, i);
    if (a->item.kind == SF_ITEM_SHARD && a->fetch && sf_fetch_done(a->fetch)) complete++;
  }
  if (t->complete_min < 0 || complete < t->complete_min) t->complete_min = complete;
}

/* Takes the next item in input order. Returns 0, SF_EAGAIN or SF_EOF. */
static int next_item(sf_node *node, tar_split *t, ahead *out) {
  fill_ahead(node, t);
  if (t->q_len == 0) return t->input_done ? SF_EOF : SF_EAGAIN;
  *out = *q_at(t, 0);
  t->q_head = (t->q_head + 1) % QUEUE;
  t->q_len--;
  if (out->item.kind == SF_ITEM_SHARD) t->q_shards--;
  return 0;
}

/*
 * Out of file descriptors (still after the retries) is the process's limit, and a dead server is not a bad
 * shard: skipping would end the epoch short, one shard after another. Such a failure stops the run whatever
 * error_policy says.
 */
static bool stops_the_run(int rc) { return rc == SF_EMFILE || rc == SF_EHOSTDOWN; }

/* An epoch was cut: downloads ahead for it (or older ones) will never be read. */
static void drop_cut_downloads(tar_split *t) {
  for (int i = 0; i < t->q_len; i++) {
    ahead *a = q_at(t, i);
    if (a->item.kind == SF_ITEM_SHARD && a->item.epoch <= t->cut_epoch) {
      sf_fetch_close(&a->fetch);
      if (a->cache_fd >= 0) close(a->cache_fd);
      a->cache_fd = -1;
    }
  }
}

static void close_shard(tar_split *t) {
  sf_tar_reader_close(&t->tar);
  sf_shard_destroy(&t->shard);
  t->span = (sf_shard_range){0};
  free(t->range); /* after the reader: it reads these bytes */
  t->range = NULL;
}

static bool cancelled(void *node);

/* A remote shard's range into t->range (n bytes): the download started ahead (taken), else one started now. */
static int fetch_range(sf_node *node, tar_split *t, sf_shard *shard, sf_fetch **fetch, size_t n, sf_error *error) {
  int rc = 0;
  if (!*fetch) {
    rc = ensure_downloads(node, t, shard->url);
    if (rc == 0)
      rc = sf_prefetch_start_range(t->downloads, shard->url, t->span.offset, t->span.length,
                                   t->span.etag, fetch, error);
    else
      rc = sf_error_set(error, rc, SF_AT(.url = shard->url), "cannot start the range's download");
  }
  size_t got = 0;
  while (rc == 0) {
    const void *data;
    ssize_t r = sf_fetch_read(*fetch, &data, cancelled, node, error);
    if (r == 0) break;
    if (r < 0) {
      rc = (int)r;
      if (error->offset >= 0) error->offset += t->span.offset; /* the fetch counts from the range's start */
      break;
    }
    if ((size_t)r > n - got) {
      rc = sf_error_set(error, SF_EIO, SF_AT(.url = shard->url, .offset = t->span.offset),
                        "the server sent more than the %zu bytes asked for", n);
      break;
    }
    memcpy(t->range + got, data, (size_t)r);
    got += (size_t)r;
  }
  if (rc == 0 && got != n)
    rc = sf_error_set(error, SF_EIO, SF_AT(.url = shard->url, .offset = t->span.offset + (int64_t)got),
                      "the range ended after %zu of its %zu bytes; the shard is shorter than its index says "
                      "(rewritten since it was indexed?): run shardflow index on it again", got, n);
  sf_fetch_close(fetch);
  return rc;
}

/*
 * Records the failure rc (*error says what) of the indexed read of shard (taken and freed), and counts its
 * range's samples as skipped when the error policy goes on. Returns what open_range returns.
 */
static int range_failed(sf_node *node, tar_split *t, sf_shard *shard, int rc, sf_error *error) {
  char url[512];
  snprintf(url, sizeof url, "%s", shard->url);
  /* A remote range refused as changed (HTTP 412, another ETag) or short: name the index it came from and the
     command that rebuilds it, which the download layer cannot know. */
  char rebuild[1400] = "";
  const char *index = t->span.index;
  if (rc == SF_EIO && index) {
    const char *slash = strrchr(index, '/');
    snprintf(rebuild, sizeof rebuild, "; the range comes from the index %s: `shardflow index --out %.*s %s` "
             "rebuilds it", index, slash ? (int)(slash - index) : 1, slash ? index : ".", shard->url);
  }
  uint64_t lost = t->span.samples;
  t->span = (sf_shard_range){0};
  sf_shard_destroy(&shard);
  free(t->range);
  t->range = NULL;
  if (rc == SF_ENOMEM && !error->message[0]) sf_error_set(error, rc, SF_AT(.url = url), "out of memory");
  if (sf_node_cancelled(node)) return SF_EOF; /* stopping: not an error of the shard */
  int policy =
      sf_node_error(node, rc, error->url[0] ? error->url : url, NULL, error->offset, "%s%s", error->message, rebuild);
  if (policy == 0) sf_node_count_skipped(node, lost); /* the range's samples: counted, never silently lost */
  return stops_the_run(rc) ? rc : policy;
}

/*
 * An indexed read: the bytes of shard's range (whole samples, see sf_shard) by pread, or a remote shard's by
 * its download (fetch, taken; NULL: one is started now), then the tar reader over them, so that the samples get
 * the same fields and keys as a read of the whole shard. Takes shard. Returns 0 (the range is open, or its
 * failure was recorded and the error policy said go on) or the policy's error.
 */
static int open_range(sf_node *node, tar_split *t, sf_shard *shard, sf_fetch *fetch) {
  enum { END_BLOCKS = 1024 }; /* tar's end-of-archive: two zero blocks */
  sf_error error = {.offset = -1, .line = -1};
  int rc = 0;
  (void)sf_shard_range_of(shard, &t->span); /* its etag is the shard's: reset where the shard goes */
  size_t n = (size_t)t->span.length;
  /* An index is outside input: a span larger than its samples may be (headers included) is not allocated. */
  int64_t most = (int64_t)t->span.samples * (t->max_sample_size + (1 << 20));
  if (t->span.samples == 0 || t->span.length > most) {
    rc = sf_error_set(&error, SF_ETOOBIG, SF_AT(.url = shard->url, .offset = t->span.offset),
                      "the index gives %llu sample(s) here %lld bytes, more than max_sample_size allows; check the "
                      "index (shardflow index writes it again) or raise max_sample_size",
                      (unsigned long long)t->span.samples, (long long)t->span.length);
    goto parse;
  }
  if (sf_url_is_remote(shard->url)) {
    if (!(t->range = calloc(1, n + END_BLOCKS)))
      rc = sf_error_set(&error, SF_ENOMEM, SF_AT(.url = shard->url), "out of memory for a %zu-byte read", n);
    if (rc == 0) rc = fetch_range(node, t, shard, &fetch, n, &error);
    sf_fetch_close(&fetch);
    goto parse;
  }
  if (!t->range_url || strcmp(t->range_url, shard->url) != 0) {
    if (t->range_fd >= 0) close(t->range_fd);
    free(t->range_url);
    t->range_url = NULL;
    char *path = sf_url_local_path(shard->url);
    t->range_fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (t->range_fd < 0)
      rc = sf_error_set(&error, path ? (errno == ENOENT ? SF_ENOENT : SF_EIO) : SF_EUNSUPPORTED,
                        SF_AT(.url = shard->url), "cannot open the shard for an indexed read: %s",
                        path ? strerror(errno) : "not a local file");
    free(path);
    if (rc == 0 && !(t->range_url = strdup(shard->url))) rc = SF_ENOMEM;
  }
  if (rc == 0 && !(t->range = calloc(1, n + END_BLOCKS)))
    rc = sf_error_set(&error, SF_ENOMEM, SF_AT(.url = shard->url), "out of memory for a %zu-byte read", n);
  double began = now();
  for (size_t got = 0; rc == 0 && got < n;) {
    ssize_t r = pread(t->range_fd, t->range + got, n - got, (off_t)(t->span.offset + (int64_t)got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      rc = sf_error_set(&error, SF_EIO, SF_AT(.url = shard->url, .offset = t->span.offset + (int64_t)got),
                        "indexed read: %s; the shard is shorter than its index says (rewritten since it was "
                        "indexed?): run shardflow index on it again", r < 0 ? strerror(errno) : "end of file");
    else
      got += (size_t)r;
  }
  __atomic_fetch_add(&t->read_ns, (uint64_t)((now() - began) * 1e9), __ATOMIC_RELAXED);
parse:
  sf_fetch_close(&fetch); /* not read: refused before */
  if (rc == 0) rc = sf_tar_reader_open_memory(&t->tar, t->range, n + END_BLOCKS, shard->url, &error);
  if (rc < 0) return range_failed(node, t, shard, rc, &error);
  sf_tar_reader_set_limits(t->tar, t->max_member_size, t->max_sample_size);
  sf_tar_reader_set_key_rule(t->tar, (sf_key_rule)t->key_rule, t->compiled ? &t->regex : NULL);
  t->shard = shard;
  return 0;
}

static bool cancelled(void *node) { return sf_node_cancelled(node); }

/*
 * The epoch and pass accounts of a shard whose turn came (taken from a's item into *shard): 1 when it is to be
 * read; 0 when its epoch already has its samples_per_epoch samples; SF_ENOENT (recorded, whatever the error
 * policy) when a whole pass before it yielded no sample. In the last two it frees *shard and clears a.
 */
static int shard_turn(sf_node *node, tar_split *t, ahead *a, sf_shard **shard) {
  uint64_t epoch = a->item.epoch;
  if (t->cut && epoch <= t->cut_epoch) {
    /* The epoch already has its samples_per_epoch samples. */
    sf_shard_destroy(shard);
    ahead_clear(a);
    return 0;
  }
  if (!t->started || epoch != t->epoch) {
    t->started = true;
    t->epoch = epoch;
    t->emitted = 0;
    t->pass = (*shard)->pass;
    t->pass_samples = 0;
  }
  if ((*shard)->pass != t->pass) {
    /* Repeating passes to reach samples_per_epoch: a pass without a single sample would repeat forever. */
    if (t->pass_samples == 0) {
      char url[512];
      snprintf(url, sizeof url, "%s", (*shard)->url);
      sf_shard_destroy(shard);
      ahead_clear(a);
      sf_node_error(node, SF_ENOENT, url, NULL, -1,
                    "a whole pass over this rank's shards yielded no sample, so samples_per_epoch can "
                    "never be reached; check shard_source.urls and that members are named KEY.EXT");
      return SF_ENOENT;
    }
    t->pass = (*shard)->pass;
    t->pass_samples = 0;
  }
  return 1;
}

/*
 * A whole shard: the tar reader over its stream, with the download (or cached copy) taken ahead for it in a.
 * Takes shard. Returns 0 (open, or its failure recorded and the error policy said go on) or the error.
 */
static int open_stream(sf_node *node, tar_split *t, ahead *a, sf_shard *shard) {
  if (sf_url_is_remote(shard->url)) {
    (void)ensure_downloads(node, t, shard->url); /* counts retries */
    if (t->tune && t->window_start == 0) { /* the tuner's clock starts with the first remote shard */
      t->window_start = now();
      t->trainer_start = trainer_wait(node);
      t->complete_min = -1;
    }
  }
  sf_shard_reader_options o = {
      .allow_pipe = sf_shard_allow_pipe(shard),
      .connect_timeout = t->connect_timeout,
      .stall_timeout = t->stall_timeout,
      .retries = (int)t->retries,
      .retry_wait = t->retry_wait,
      .retry_max_wait = t->retry_max_wait,
      .ca_file = t->ca_file,
      .fetch = a->fetch,
      .prefetch = t->downloads,
      .cache = t->cache,
      .cached_fd = a->cache_fd,
      .cancelled = cancelled,
      .cancel_opaque = node,
      .mmap = t->mmap,
      .read_ns = &t->read_ns,
  };
  a->fetch = NULL; /* the readers own them now */
  a->cache_fd = -1;
  sf_error error;
  int rc = sf_tar_reader_open(&t->tar, shard->url, &o, &error);
  if (rc < 0) {
    sf_shard_destroy(&shard);
    if (sf_node_cancelled(node)) return SF_EOF; /* stopping: not an error of the shard */
    int policy = sf_node_error(node, rc, error.url, NULL, error.offset, "%s", error.message);
    return stops_the_run(rc) ? rc : policy;
  }
  sf_tar_reader_set_limits(t->tar, t->max_member_size, t->max_sample_size);
  sf_tar_reader_set_key_rule(t->tar, (sf_key_rule)t->key_rule, t->compiled ? &t->regex : NULL);
  sf_tar_reader_set_tfrecord(t->tar, &(sf_tfrecord_options){.key_feature = t->tfrecord_key,
                                                             .fields = t->tfrecord_fields.v,
                                                             .n_fields = t->tfrecord_fields.n});
  t->shard = shard;
  return 0;
}

/* Opens the shard item of a (its turn came): an indexed read's range, or the whole shard. */
static int open_shard(sf_node *node, tar_split *t, ahead *a) {
  sf_shard *shard = a->item.u.shard;
  a->item.u.shard = NULL;
  a->item.kind = SF_ITEM_NONE;
  int turn = shard_turn(node, t, a, &shard);
  if (turn <= 0) return turn;
  sf_shard_range range;
  if (sf_shard_range_of(shard, &range)) {
    sf_fetch *fetch = a->fetch;
    a->fetch = NULL;
    ahead_clear(a);
    return open_range(node, t, shard, fetch);
  }
  return open_stream(node, t, a, shard);
}

static uint64_t sample_bytes(const sf_sample *s) {
  uint64_t n = 0;
  for (int i = 0; i < s->n_fields; i++) n += sf_tensor_nbytes(&s->fields[i].tensor);
  return n;
}

/*
 * A sample the reader returned just before the shard's damage, with no member of another key (or
 * the shard's end) after it to show it whole: it is taken as whole when it has every field of the
 * last sample emitted (samples of a dataset share their fields); otherwise members of it were lost.
 * Writes why not into why.
 */
static bool whole_enough(const tar_split *t, sf_sample *sample, char *why, size_t why_size) {
  if (t->n_ref_fields < 0) {
    snprintf(why, why_size, "cannot be told whole (no sample before it to compare its fields with)");
    return false;
  }
  for (int i = 0; i < t->n_ref_fields; i++)
    if (!sf_sample_field(sample, t->ref_fields[i])) {
      snprintf(why, why_size, "lacks field '%s', which the sample before it has", t->ref_fields[i]);
      return false;
    }
  return true;
}

static void remember_fields(tar_split *t, const sf_sample *sample) {
  bool same = t->n_ref_fields == sample->n_fields;
  for (int i = 0; same && i < sample->n_fields; i++) same = strcmp(t->ref_fields[i], sample->fields[i].name) == 0;
  if (same) return;
  for (int i = 0; i < sample->n_fields; i++) snprintf(t->ref_fields[i], sizeof t->ref_fields[i], "%s", sample->fields[i].name);
  t->n_ref_fields = sample->n_fields;
}

/*
 * Drops *sample, cut by the damage that follows it: one record, the damage's, names it, and it is
 * counted as skipped; passed on, it would be a second error downstream (batch's "field is missing"),
 * or worse, the fields of every batch after it.
 */
static int drop_cut_sample(sf_node *node, tar_split *t, sf_sample **sample, const char *why) {
  sf_sample *none = NULL;
  sf_error error = {.offset = -1, .line = -1};
  int rc = sf_tar_reader_next(t->tar, &none, &error); /* the failure, sticky in the reader */
  sf_sample_destroy(&none);
  char key[sizeof error.key];
  snprintf(key, sizeof key, "%s", (*sample)->key);
  sf_sample_destroy(sample);
  close_shard(t);
  if (sf_node_cancelled(node)) return SF_EOF; /* stopping: not an error of the shard */
  if (rc >= 0) rc = SF_EFORMAT;
  int policy = sf_node_error(node, rc, error.url, key, error.offset, "%s; sample %s, read before the damage, %s: "
                             "it is dropped", error.message, key, why);
  if (stops_the_run(rc)) return rc;
  if (policy < 0) return policy;
  sf_node_count_skipped(node, 1);
  return 0;
}

/* Emits the next sample of the open shard (one its plan keeps), ending the epoch when it has its quota. */
static int read_sample(sf_node *node, tar_split *t) {
  sf_sample *sample = NULL;
  sf_error error;
  int rc = sf_tar_reader_next(t->tar, &sample, &error);
  if (rc == SF_EOF) {
    close_shard(t);
    return 0;
  }
  if (rc < 0) {
    /* The reader returns the sample of a problem that spoils only that sample (see sf_tar_reader_next). */
    bool recoverable = sample != NULL;
    sf_sample_destroy(&sample);
    if (sf_node_cancelled(node)) {
      close_shard(t);
      return SF_EOF; /* stopping: not an error of the shard */
    }
    if (t->span.length > 0 && error.offset >= 0) error.offset += t->span.offset;
    /* A damaged stream cannot be resynchronised: the rest of the shard is abandoned. */
    if (!recoverable) close_shard(t);
    /* The reader names a key only when the failure cut a sample (truncation, a download failed for good). */
    bool cut_sample = !recoverable && error.key[0];
    int policy = sf_node_error(node, rc, error.url, error.key, error.offset, "%s", error.message);
    if (stops_the_run(rc)) return rc;
    if (policy < 0) return policy;
    if (recoverable || cut_sample) sf_node_count_skipped(node, 1);
    return 0;
  }
  if (t->span.length > 0) { /* an indexed read: positions in the range are positions in the shard */
    sample->index += t->span.first_sample;
    sample->offset += t->span.offset;
  }
  if (!sf_shard_keeps(t->shard, sample->index)) {
    sf_sample_destroy(&sample); /* not in the resume plan: consumed before the resume, or another rank's */
    return 0;
  }
  char why[128];
  if (sf_tar_reader_failed(t->tar) && !whole_enough(t, sample, why, sizeof why))
    return drop_cut_sample(node, t, &sample, why);
  remember_fields(t, sample);
  sample->epoch = t->epoch;
  sample->shard_index = t->shard->index;
  sample->pass = t->shard->pass;
  uint64_t bytes = sample_bytes(sample);
  sf_item out = {.kind = SF_ITEM_SAMPLE, .epoch = t->epoch, .u.sample = sample};
  sf_node_push(node, &out);
  sf_node_count_output(node, 1, bytes);
  t->emitted++;
  t->pass_samples++;
  uint64_t quota = t->shard->samples_per_epoch;
  if (quota > 0 && t->emitted >= quota) {
    close_shard(t);
    sf_item end = {.kind = SF_ITEM_EPOCH_END, .epoch = t->epoch};
    sf_node_push(node, &end);
    sf_node_close_epoch(node, t->epoch);
    t->cut = true;
    t->cut_epoch = t->epoch;
    drop_cut_downloads(t);
  }
  return 0;
}

/*
 * Steps never wait for the network: a remote shard is opened once its first
 * bytes (or its failure) arrived, and a sample is read once the bytes it needs
 * did (sf_tar_reader_ready); until then the step returns SF_EAGAIN, the
 * executor counts the time as wait, and the download thread's wake hook has
 * the node stepped again.  Local files are read synchronously.
 */
static int step(sf_node *node) {
  tar_split *t = sf_node_priv(node);
  if (t->tar) {
    int taken = t->prefetch > 0 ? fill_ahead(node, t) : 0; /* the next shards download while this one is split */
    if (!sf_tar_reader_ready(t->tar)) {
      download_wait(node, t);
      return taken ? 0 : SF_EAGAIN;
    }
    download_go(node, t, false);
    return read_sample(node, t);
  }
  int taken = fill_ahead(node, t);
  ahead *first = t->q_len > 0 ? q_at(t, 0) : NULL;
  sf_shard_range range;
  int64_t need = first && first->item.kind == SF_ITEM_SHARD && sf_shard_range_of(first->item.u.shard, &range)
                     ? range.length : 1; /* a range: all of it */
  if (first && first->fetch && !sf_fetch_done(first->fetch) && !sf_fetch_ready(first->fetch, need)) {
    download_wait(node, t);
    return taken ? 0 : SF_EAGAIN;
  }
  if (t->q_len > 0 && q_at(t, 0)->item.kind == SF_ITEM_SHARD) {
    count_complete(t);
    download_go(node, t, true);
  }
  ahead a;
  int rc = next_item(node, t, &a);
  if (rc < 0) return rc; /* SF_EAGAIN, or SF_EOF: no shard is open */
  switch (a.item.kind) {
  case SF_ITEM_SHARD: return open_shard(node, t, &a);
  case SF_ITEM_EPOCH_END:
    /* One-pass mode: the source ends epochs. An end for an epoch already cut is stale. */
    if (t->cut && a.item.epoch <= t->cut_epoch) return 0;
    sf_node_push(node, &a.item);
    return 0;
  default: ahead_clear(&a); return 0;
  }
}

/* Compiles key_regex for key_rule regex; refuses one that does not compile or has no group for the key. */
static int compile_key_regex(sf_node *node, tar_split *t) {
  const char *re = t->key_regex ? t->key_regex : "";
  if ((t->key_rule == SF_KEY_REGEX) != (re[0] != '\0')) {
    sf_node_error(node, SF_EOPTION, NULL, NULL, -1,
                  "options key_rule and key_regex go together: set key_rule: regex and a key_regex such as "
                  "\"^([^.]*[.][0-9]+)[.](.+)$\", or neither");
    return SF_EOPTION;
  }
  if (t->key_rule != SF_KEY_REGEX) return 0;
  int rc = regcomp(&t->regex, re, REG_EXTENDED);
  if (rc != 0) {
    char why[256];
    regerror(rc, &t->regex, why, sizeof why);
    sf_node_error(node, SF_EOPTION, NULL, NULL, -1, "option key_regex \"%s\" does not compile: %s", re, why);
    return SF_EOPTION;
  }
  t->compiled = true;
  if (t->regex.re_nsub < 1) {
    sf_node_error(node, SF_EOPTION, NULL, NULL, -1,
                  "option key_regex \"%s\" has no group: put the key in parentheses, e.g. \"^([^.]*[.][0-9]+)[.](.+)$\"", re);
    return SF_EOPTION;
  }
  return 0;
}

/* The reader's read time and network counters for the stage table, /metrics and the bottleneck report (the stage's
 * stats callback); any thread. */
static int describe(sf_node *node, sf_stage_stats *x, sf_worker_stats *workers, int max_workers) {
  (void)workers, (void)max_workers;
  tar_split *t = sf_node_priv(node);
  x->reads = true;
  x->read_ns = __atomic_load_n(&t->read_ns, __ATOMIC_RELAXED);
  sf_prefetch *downloads = __atomic_load_n(&t->downloads, __ATOMIC_ACQUIRE);
  if (!downloads) return 0;
  sf_prefetch_stats s;
  sf_prefetch_stats_get(downloads, &s);
  x->reader = true;
  x->downloaded_bytes = s.bytes;
  x->refetched_bytes = s.refetched_bytes;
  x->retries = s.retries;
  x->prefetch = (uint64_t)__atomic_load_n(&t->prefetch, __ATOMIC_RELAXED);
  int64_t ms = __atomic_load_n(&t->changed_ms, __ATOMIC_RELAXED);
  x->tuned[0] = (sf_stage_tuned){.option = "prefetch", .value = (int64_t)x->prefetch, .initial = t->prefetch_initial,
                                .pinned = !t->tune, .changes = __atomic_load_n(&t->changes, __ATOMIC_RELAXED),
                                .changed_at = (double)ms / 1000.0};
  x->n_tuned = 1;
  if (t->cache) {
    sf_shard_cache_stats c;
    sf_shard_cache_stats_get(t->cache, &c);
    x->cache_hits = c.hits;
  }
  return 0;
}

static int init(sf_node *node) {
  tar_split *t = sf_node_priv(node);
  t->n_ref_fields = -1;
  t->range_fd = -1;
  /* A written prefetch (0 included) pins it; the default is where the tuner starts. */
  t->tune = !sf_node_option_written(node, "prefetch") && t->prefetch > 0;
  t->prefetch_initial = t->prefetch;
  t->complete_min = -1;
  t->lower_after = LOWER_AFTER;
  int krc = compile_key_regex(node, t);
  if (krc < 0) return krc;
  for (int i = 0; i < t->tfrecord_fields.n; i++) {
    const char *item = t->tfrecord_fields.v[i], *eq = strchr(item, '=');
    if (!eq || eq == item || !eq[1] || eq - item >= SF_FIELD_NAME_MAX) {
      sf_node_error(node, SF_EOPTION, NULL, NULL, -1, "option tfrecord_fields: \"%s\" is not FIELD=FEATURE with a "
                    "FIELD of 1 to %d bytes; write e.g. \"jpg=image/encoded,cls=image/class/label\"", item,
                    SF_FIELD_NAME_MAX - 1);
      return SF_EOPTION;
    }
  }
  if (t->ca_file && t->ca_file[0] && access(t->ca_file, R_OK) != 0) {
    sf_node_error(node, SF_EOPTION, NULL, NULL, -1, "option ca_file: cannot read %s: %s — give the PEM file of "
                  "the CA that signed the servers' certificates", t->ca_file, strerror(errno));
    return SF_EOPTION;
  }
  if (t->cache_dir && t->cache_dir[0]) {
    sf_error error;
    int rc = sf_shard_cache_open(&t->cache, t->cache_dir, t->cache_size, &error);
    if (rc < 0) {
      sf_node_error(node, rc, error.url, NULL, -1, "cache_dir: %s", error.message);
      return rc;
    }
  }
  return 0;
}

static void uninit(sf_node *node) {
  tar_split *t = sf_node_priv(node);
  if (t->compiled) regfree(&t->regex);
  close_shard(t);
  while (t->q_len > 0) {
    ahead a = *q_at(t, 0);
    t->q_head = (t->q_head + 1) % QUEUE;
    t->q_len--;
    ahead_clear(&a);
  }
  if (t->downloads) {
    sf_prefetch_stats s;
    sf_prefetch_stats_get(t->downloads, &s);
    /* The end-of-run account of the network: what was fetched twice and why. */
    sf_node_log(node, SF_LOG_INFO | SF_LOG_UNPREFIXED,
                "downloaded %llu shard(s), %.1f MiB; refetched %llu bytes; %llu retries (%llu resumed "
                "with Range); %llu failed",
                (unsigned long long)(s.shards - s.not_modified), (double)s.bytes / 1048576.0,
                (unsigned long long)s.refetched_bytes, (unsigned long long)s.retries, (unsigned long long)s.resumes,
                (unsigned long long)s.failed);
    sf_prefetch_destroy(&t->downloads);
  }
  if (t->cache) {
    sf_shard_cache_stats c;
    sf_shard_cache_stats_get(t->cache, &c);
    sf_node_log(node, SF_LOG_INFO | SF_LOG_UNPREFIXED,
                "shard cache: %llu hit(s), %llu stale, %llu miss(es); %.1f MiB evicted", (unsigned long long)c.hits,
                (unsigned long long)c.stale, (unsigned long long)c.misses, (double)c.evicted_bytes / 1048576.0);
  }
  sf_shard_cache_close(&t->cache);
  if (t->range_fd >= 0) close(t->range_fd);
  t->range_fd = -1;
  free(t->range_url);
  t->range_url = NULL;
}

const sf_stage_def sf_stage_tar_split = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "tar_split",
    .summary = "streams tar shards (path, file://, http(s)://, pipe:) and groups members into "
               "samples by key; .tfrecord shards give one sample per tf.train.Example",
    .inputs = SF_PORTS({"in", SF_PORT_SHARD}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .priv_size = sizeof(tar_split),
    .options = options,
    .init = init,
    .step = step,
    .uninit = uninit,
    .stats = describe,
};
