/* video plugin: stage `video` decodes clips of MP4/WebM/MKV... fields (libavformat, libavcodec) to uint8
 * [T,H,W,3] RGB (libswscale) with their timestamps, choosing frames uniformly, as a random clip, or at a rate. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/plugin.h"
#include "shardflow/stage.h"
#include "clip.h"

enum { SAMPLING_UNIFORM, SAMPLING_RANDOM_CLIP, SAMPLING_FPS };
static const char *const sampling_names[] = {"uniform", "random_clip", "fps", NULL};
enum { START_RANDOM, START_FIRST, START_CENTER };
static const char *const start_names[] = {"random", "first", "center", NULL};
enum { SHORT_EDGE, SHORT_ZEROS, SHORT_SKIP };
static const char *const short_names[] = {"edge", "zeros", "skip", NULL};
enum { MISSING_ERROR, MISSING_EMPTY };
static const char *const missing_names[] = {"error", "empty", NULL};

typedef struct video {
  sf_name_list fields;     /* option: fields to decode */
  int64_t frames;          /* option: T */
  int sampling;            /* option: index into sampling_names */
  int64_t stride;          /* option: frames between a random clip's frames */
  double fps;              /* option: rate of sampling: fps */
  int start;               /* option: index into start_names */
  int short_mode;          /* option: index into short_names */
  int64_t threads;         /* option: decoder threads */
  int64_t max_clip_bytes;  /* option: largest T x H x W x 3 */
  sf_name_list containers; /* option: demuxers allowed */
  bool audio;              /* option: also FIELD.audio and FIELD.audio_rate */
  int missing_audio;       /* option: index into missing_names */
  char *whitelist;         /* containers joined with commas, for libavformat; owned */
} video;

static const sf_option options[] = {
    {"fields", SF_OPT_NAME_LIST, offsetof(video, fields), "mp4,webm,mkv,mov,avi", 0, 0,
     "names of the encoded fields to decode (each a whole video file); others pass through", NULL},
    {"frames", SF_OPT_COUNT, offsetof(video, frames), "8", 1, 4096, "frames per clip (T of the [T,H,W,3] output)",
     NULL},
    {"sampling", SF_OPT_ENUM, offsetof(video, sampling), "uniform", 0, 0,
     "which frames: uniform (spread over the whole video: frame floor((2k+1)N/2T) of N), random_clip (T frames "
     "`stride` apart from a start `start` chooses), fps (the frames shown at `fps` per second from the first, "
     "then T consecutive of them from a start `start` chooses)",
     sampling_names},
    {"stride", SF_OPT_COUNT, offsetof(video, stride), "1", 1, 1e6,
     "frames from one frame of a random_clip to the next (1 = consecutive frames)", NULL},
    {"fps", SF_OPT_FLOAT, offsetof(video, fps), "0", 0, 1000,
     "frames per second of sampling: fps, in Hz (required there, > 0)", NULL},
    {"start", SF_OPT_ENUM, offsetof(video, start), "random", 0, 0,
     "where a random_clip or fps clip starts when the video is longer: random (drawn from the sample's own "
     "seeded stream: the same for any replica count), first, or center",
     start_names},
    {"short", SF_OPT_ENUM, offsetof(video, short_mode), "edge", 0, 0,
     "a video with fewer frames than the clip needs: edge (repeat its last frame), zeros (black frames, pts NaN) "
     "or skip (drop the sample, counted as filtered and in short_skipped)",
     short_names},
    {"threads", SF_OPT_INT, offsetof(video, threads), "1", 1, 64,
     "decoder threads per replica (libavcodec's frame and slice threads); replicas add more", NULL},
    {"max_clip_bytes", SF_OPT_SIZE, offsetof(video, max_clip_bytes), "512MiB", 1, 1e12,
     "largest decoded clip (T x H x W x 3 bytes) and largest decoded frame accepted; a larger one is an error "
     "record before its memory is allocated",
     NULL},
    {"containers", SF_OPT_NAME_LIST, offsetof(video, containers), "mov,matroska,avi,mpegts,ogg,flv,ivf", 0, 0,
     "libavformat demuxers allowed to read a member (`ffmpeg -demuxers` names; mov covers MP4, matroska WebM); "
     "an empty list allows every one",
     NULL},
    {"audio", SF_OPT_BOOL, offsetof(video, audio), "false", 0, 0,
     "also decode the audio track to FIELD.audio, float32 [channels, samples] at the stream's own rate (FIELD.audio_rate, "
     "int64 Hz), the samples of the clip's span [first frame's time, last frame's time + one frame) (libavcodec, "
     "libswresample)",
     NULL},
    {"missing_audio", SF_OPT_ENUM, offsetof(video, missing_audio), "error", 0, 0,
     "a video without an audio stream when audio is true: error (an error record, so error_policy decides) or empty "
     "(FIELD.audio float32 [0,0], FIELD.audio_rate 0, counted in audio_missing)",
     missing_names},
    {NULL},
};

static int init(sf_node *node) {
  video *v = sf_node_priv(node);
  if (v->sampling == SAMPLING_FPS && !(v->fps > 0))
    return sf_node_option_error(node, "fps", "sampling: fps needs a rate: give fps > 0 (frames per second)");
  if (v->fields.n == 0) return sf_node_option_error(node, "fields", "names no field: give e.g. [mp4, webm]");
  size_t len = 1;
  for (int i = 0; i < v->containers.n; i++)
    len += strlen(v->containers.v[i]) + 1;
  if (!(v->whitelist = calloc(1, len))) return SF_ENOMEM;
  for (int i = 0; i < v->containers.n; i++) {
    if (i) strcat(v->whitelist, ",");
    strcat(v->whitelist, v->containers.v[i]);
  }
  int r = 0;
  const char *const counters[] = {"frames_decoded", "short_padded", "short_skipped", "audio_missing"};
  for (size_t i = 0; i < sizeof counters / sizeof counters[0] && r == 0; i++)
    r = sf_node_counter_add(node, counters[i], 0);
  return r;
}

static void uninit(sf_node *node) {
  video *v = sf_node_priv(node);
  free(v->whitelist);
}

static bool wanted(const video *v, const char *name) {
  for (int i = 0; i < v->fields.n; i++)
    if (strcmp(v->fields.v[i], name) == 0) return true;
  return false;
}

/* The start of a window of `want` positions among `have` (have >= want), as option `start` says. */
static int64_t window_start(const video *v, sf_node *node, const sf_sample *s, int64_t have, int64_t want) {
  if (v->start == START_FIRST) return 0;
  if (v->start == START_CENTER) return (have - want) / 2;
  uint64_t seed = sf_node_seed(node);
  seed = sf_seed_mix(seed, s->epoch);
  seed = sf_seed_mix(seed, s->pass);
  seed = sf_seed_mix(seed, s->shard_index);
  seed = sf_seed_mix(seed, s->index);
  sf_rng rng;
  sf_rng_seed(&rng, seed);
  return (int64_t)sf_rng_below(&rng, (uint64_t)(have - want + 1));
}

/* The last frame shown at time t (seconds): the last whose time is <= t (0 before the first). */
static int64_t frame_shown(const video_reader *r, int64_t n, double t) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (video_frame_time(r, mid) <= t + 1e-9)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo > 0 ? lo - 1 : 0;
}

/* Fills idx with the frames the sampling rule picks (at most T, ascending) and returns how many. */
static int pick_frames(const video *v, sf_node *node, const sf_sample *s, const video_reader *r, int64_t *idx) {
  int64_t n = video_get_info(r)->frames, t = v->frames, k = 0;
  switch (v->sampling) {
  case SAMPLING_UNIFORM:
    if (n < t) {
      for (; k < n; k++)
        idx[k] = k;
    } else {
      for (; k < t; k++)
        idx[k] = (int64_t)(((__int128)(2 * k + 1) * n) / (2 * t));
    }
    break;
  case SAMPLING_RANDOM_CLIP: {
    int64_t span = (t - 1) * v->stride + 1;
    int64_t from = n >= span ? window_start(v, node, s, n, span) : 0;
    for (; k < t && from + k * v->stride < n; k++)
      idx[k] = from + k * v->stride;
    break;
  }
  default: { /* fps: grid points t0 + j / fps up to the last frame's time */
    double t0 = video_frame_time(r, 0), t1 = video_frame_time(r, n - 1);
    double span = (t1 - t0) * v->fps;
    int64_t points = span > 1e15 ? (int64_t)1e15 : (int64_t)floor(span + 1e-6) + 1;
    int64_t from = points >= t ? window_start(v, node, s, points, t) : 0;
    for (; k < t && from + k < points; k++)
      idx[k] = frame_shown(r, n, t0 + (double)(from + k) / v->fps);
    break;
  }
  }
  return (int)k;
}

/* Why a field cannot be decoded, for the node's error record. */
typedef struct failure {
  int code;
  char text[400];
} failure;

static int fail(failure *why, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(failure *why, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why->text, sizeof why->text, fmt, ap);
  va_end(ap);
  return why->code = code;
}

static int reader_code(int r) { return r == VIDEO_TOO_BIG ? SF_ETOOBIG : r == VIDEO_NOMEM ? SF_ENOMEM : SF_EFORMAT; }

/* "<field>.<suffix>" into name: false when too long or already in s. */
static bool new_name(sf_sample *s, const sf_field *f, const char *suffix, char name[SF_FIELD_NAME_MAX + 16]) {
  snprintf(name, SF_FIELD_NAME_MAX + 16, "%s.%s", f->name, suffix);
  return strlen(name) < SF_FIELD_NAME_MAX && !sf_sample_field(s, name);
}

/*
 * The clip's audio (frames idx[0..n-1] decoded, n >= 1) as float32 [channels, samples] in *audio and its rate as an
 * int64 scalar in *rate; a video without audio is v->missing_audio's. Returns 0 or an SF_E* code with why filled.
 */
static int decode_clip_audio(sf_node *node, video_reader *r, const int64_t *idx, int n, sf_tensor *audio,
                             sf_tensor *rate, failure *why) {
  const video *v = sf_node_priv(node);
  double t0 = video_frame_time(r, idx[0]), t1 = video_frame_time(r, idx[n - 1]) + video_frame_duration(r, idx[n - 1]);
  video_audio pcm;
  int rc = video_decode_audio(r, t0, t1, &pcm, why->text, sizeof why->text);
  if (rc == VIDEO_NO_AUDIO && v->missing_audio == MISSING_ERROR) {
    size_t len = strlen(why->text);
    snprintf(why->text + len, sizeof why->text - len, " (audio: true; missing_audio: empty allows it)");
    return why->code = SF_EFORMAT;
  }
  if (rc < 0 && rc != VIDEO_NO_AUDIO) return why->code = reader_code(rc);
  if (rc == VIDEO_NO_AUDIO) sf_node_counter_add(node, "audio_missing", 1);
  const int64_t shape[2] = {pcm.channels, pcm.frames};
  if (sf_tensor_alloc(audio, SF_DTYPE_FLOAT32, 2, shape) < 0 || sf_tensor_alloc(rate, SF_DTYPE_INT64, 0, NULL) < 0) {
    free(pcm.samples);
    sf_tensor_clear(audio);
    return fail(why, SF_ENOMEM, "out of memory for the clip's audio");
  }
  if (pcm.samples) memcpy(sf_tensor_data(audio), pcm.samples, sf_tensor_nbytes(audio));
  free(pcm.samples);
  *(int64_t *)sf_tensor_data(rate) = pcm.rate;
  return 0;
}

/* Decodes field f of sample s into uint8 [T,H,W,3] and appends "<name>.pts"; *skip set when the video is short
 * and `short: skip` drops the sample. */
static int decode_field(sf_node *node, sf_sample *s, sf_field *f, bool *skip, failure *why) {
  const video *v = sf_node_priv(node);
  sf_tensor *t = &f->tensor;
  if (t->dtype != SF_DTYPE_UINT8 || t->ndim != 1 || !t->buffer || !sf_tensor_is_contiguous(t))
    return fail(why, SF_EINVAL, "is marked encoded but does not hold bytes");
  char pts_name[SF_FIELD_NAME_MAX + 16], audio_name[SF_FIELD_NAME_MAX + 16], rate_name[SF_FIELD_NAME_MAX + 16];
  if (!new_name(s, f, "pts", pts_name) || s->n_fields >= SF_MAX_FIELDS)
    return fail(why, SF_EDUP, "cannot add field %s (too long, already there, or the sample is full)", pts_name);
  if (v->audio && (!new_name(s, f, "audio", audio_name) || !new_name(s, f, "audio_rate", rate_name) ||
                   s->n_fields + 3 > SF_MAX_FIELDS))
    return fail(why, SF_EDUP, "cannot add fields %s.audio and %s.audio_rate (too long, already there, or the "
                "sample is full: at most %d fields)", f->name, f->name, SF_MAX_FIELDS);
  video_limits limits = {.threads = (int)v->threads, .max_clip_bytes = v->max_clip_bytes, .containers = v->whitelist};
  video_reader *r;
  int rc = video_open(&r, sf_tensor_data(t), (size_t)t->shape[0], &limits, why->text, sizeof why->text);
  if (rc < 0) return why->code = reader_code(rc);
  const video_info *info = video_get_info(r);
  int64_t T = v->frames, frame_bytes = (int64_t)info->width * info->height * 3;
  if (frame_bytes > v->max_clip_bytes / T) {
    fail(why, SF_ETOOBIG,
         "codec %s: a clip of %lld frames of %dx%d is %.0f bytes, more than max_clip_bytes (%lld): lower frames "
         "or raise max_clip_bytes",
         info->codec, (long long)T, info->width, info->height, (double)frame_bytes * (double)T,
         (long long)v->max_clip_bytes);
    video_close(&r);
    return why->code;
  }
  int64_t *idx = malloc((size_t)T * sizeof *idx);
  sf_tensor out = {0}, pts = {0};
  const int64_t shape[4] = {T, info->height, info->width, 3};
  if (!idx || sf_tensor_alloc(&out, SF_DTYPE_UINT8, 4, shape) < 0 ||
      sf_tensor_alloc(&pts, SF_DTYPE_FLOAT64, 1, &T) < 0) {
    free(idx);
    sf_tensor_clear(&out);
    video_close(&r);
    return fail(why, SF_ENOMEM, "out of memory for a clip of %lld frames of %dx%d", (long long)T, info->width,
                info->height);
  }
  int have = pick_frames(v, node, s, r, idx);
  if (have < T && v->short_mode == SHORT_SKIP) {
    free(idx);
    sf_tensor_clear(&out);
    sf_tensor_clear(&pts);
    video_close(&r);
    *skip = true;
    return 0;
  }
  int n = have;
  if (have < T && v->short_mode == SHORT_EDGE)
    for (; n < T; n++)
      idx[n] = idx[have - 1];
  uint8_t *rgb = sf_tensor_data(&out);
  double *times = sf_tensor_data(&pts);
  int64_t decoded = 0;
  rc = video_decode(r, idx, n, rgb, times, &decoded, why->text, sizeof why->text);
  sf_node_counter_add(node, "frames_decoded", (uint64_t)decoded);
  if (rc < 0) rc = why->code = reader_code(rc);
  sf_tensor audio = {0}, rate = {0};
  if (rc == 0 && v->audio) rc = decode_clip_audio(node, r, idx, n, &audio, &rate, why);
  video_close(&r);
  free(idx);
  if (rc < 0) {
    sf_tensor_clear(&out);
    sf_tensor_clear(&pts);
    return rc;
  }
  if (n < T) { /* zeros */
    memset(rgb + (size_t)n * (size_t)frame_bytes, 0, (size_t)(T - n) * (size_t)frame_bytes);
    for (int64_t i = n; i < T; i++)
      times[i] = NAN;
  }
  if (have < T) sf_node_counter_add(node, "short_padded", 1);
  sf_tensor_clear(t);
  *t = out;
  f->encoded = false;
  sf_sample_add_field(s, pts_name, false, &pts); /* room checked above */
  if (v->audio) {
    sf_sample_add_field(s, audio_name, false, &audio);
    sf_sample_add_field(s, rate_name, false, &rate);
  }
  return 0;
}

static int map(sf_node *node, sf_sample **ps) {
  const video *v = sf_node_priv(node);
  sf_sample *s = *ps;
  int n = s->n_fields; /* the .pts (and .audio) fields appended below are not decoded again */
  for (int i = 0; i < n; i++) {
    sf_field *f = &s->fields[i];
    failure why = {0};
    bool skip = false;
    if (!f->encoded || !wanted(v, f->name)) continue;
    if (decode_field(node, s, f, &skip, &why) < 0) {
      sf_node_error(node, why.code, sf_sample_url(s), s->key, s->offset, "field %s: %s", f->name, why.text);
      return why.code;
    }
    if (skip) {
      sf_node_counter_add(node, "short_skipped", 1);
      sf_sample_destroy(ps);
      return 0;
    }
  }
  return 0;
}

static const sf_stage_def video_stage = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "video",
    .summary = "decodes video fields (MP4, WebM, MKV...: libavformat, libavcodec) to uint8 [T,H,W,3] RGB clips "
               "(libswscale) and adds <field>.pts (float64 [T], seconds)",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP,
    .priv_size = sizeof(video),
    .options = options,
    .init = init,
    .map = map,
    .uninit = uninit,
};

static const sf_stage_def *const stages[] = {&video_stage, NULL};

static const sf_plugin plugin = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "video",
    .build_id = "video " SF_VIDEO_VERSION " (" SF_VIDEO_LIBS ")",
    .stages = stages,
};

/**
 * The plugin's entry point (see shardflow/plugin.h): one stage, video.
 * Returns static data the loader borrows for the life of the process.
 */
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void);
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void) { return &plugin; }
