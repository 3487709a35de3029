/* audio plugin: decodes WAV/FLAC/OGG fields with libsndfile, resamples with libsamplerate, crops/pads for batching. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <samplerate.h>

#include "shardflow/plugin.h"
#include "shardflow/stage.h"
#include "pcm.h"

typedef struct audio {
  char *fields;        /* option: comma-separated field names */
  int64_t sample_rate; /* option: Hz, 0 = keep */
  int quality;         /* option: index into quality_names == libsamplerate converter type */
  int64_t frames;      /* option: frames per channel after crop/pad, 0 = keep */
  int crop;            /* option: index into crop_names */
  int64_t max_samples; /* option: largest frames x channels accepted */
} audio;

/* In libsamplerate's order, so the index is the converter type (SRC_SINC_BEST_QUALITY = 0 ...). */
static const char *const quality_names[] = {"best", "medium", "fastest", "zero_order_hold", "linear", NULL};
enum { CROP_START, CROP_CENTER, CROP_RANDOM };
static const char *const crop_names[] = {"start", "center", "random", NULL};

static const sf_option options[] = {
    {"fields", SF_OPT_STRING, offsetof(audio, fields), "wav,flac,ogg", 0, 0,
     "comma-separated names of the fields to decode (any format libsndfile reads: WAV, FLAC, OGG/Vorbis...); "
     "others pass through",
     NULL},
    {"sample_rate", SF_OPT_INT, offsetof(audio, sample_rate), "0", 0, 1e6,
     "resample every field to this rate in Hz with libsamplerate; 0 keeps each file's own rate", NULL},
    {"quality", SF_OPT_ENUM, offsetof(audio, quality), "best", 0, 0,
     "libsamplerate converter: best, medium, fastest (band-limited sinc), zero_order_hold, linear", quality_names},
    {"frames", SF_OPT_COUNT, offsetof(audio, frames), "0", 0, 1e10,
     "frames per channel after resampling: longer audio is cropped, shorter padded with zeros at the end, so "
     "batches collate; 0 keeps the length",
     NULL},
    {"crop", SF_OPT_ENUM, offsetof(audio, crop), "start", 0, 0,
     "which frames a crop keeps: start, center, or random (seeded per sample from the graph seed)", crop_names},
    {"max_samples", SF_OPT_COUNT, offsetof(audio, max_samples), "256M", 1, 1e12,
     "largest decoded size accepted, in samples (frames x channels, 4 bytes each); larger files are errors "
     "before any memory is allocated",
     NULL},
    {NULL},
};

static bool wanted(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; p && *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == n && memcmp(p, name, n) == 0) return true;
    p = end ? end + 1 : NULL;
  }
  return false;
}

/* Why a field cannot be decoded, for the node's error record. */
typedef struct failure {
  int code;
  char text[200];
} failure;

static int fail(failure *why, int code, const char *fmt, const char *detail) {
  why->code = code;
  snprintf(why->text, sizeof why->text, fmt, detail);
  return code;
}

/* Replaces pcm's frames with lrint(frames * ratio) frames at sample_rate (zeros where the filter ran short). */
static int resample(const audio *a, audio_pcm *pcm, failure *why) {
  double ratio = (double)a->sample_rate / pcm->rate;
  int64_t out_frames = llrint((double)pcm->frames * ratio);
  if ((double)out_frames * pcm->channels > (double)a->max_samples) {
    char detail[64];
    snprintf(detail, sizeof detail, "%lld frames", (long long)out_frames);
    return fail(why, SF_ETOOBIG, "resamples to %s x channels, more than max_samples", detail);
  }
  float *out = calloc((size_t)out_frames * (size_t)pcm->channels + 1, sizeof(float));
  if (!out) return fail(why, SF_ENOMEM, "%s", "cannot allocate the resampled samples");
  SRC_DATA d = {.data_in = pcm->data, .data_out = out, .input_frames = (long)pcm->frames,
                .output_frames = (long)out_frames, .src_ratio = ratio};
  int e = src_simple(&d, a->quality, pcm->channels);
  if (e) {
    free(out);
    return fail(why, SF_EINVAL, "libsamplerate: %s", src_strerror(e));
  }
  free(pcm->data);
  pcm->data = out;
  pcm->frames = out_frames;
  pcm->rate = (int)a->sample_rate;
  return 0;
}

/* First frame a crop keeps, when frames exceed the target. */
static int64_t crop_start(const audio *a, sf_node *node, const sf_sample *s, int64_t have, int64_t want) {
  if (a->crop == CROP_START) return 0;
  if (a->crop == CROP_CENTER) return (have - want) / 2;
  uint64_t seed = sf_node_seed(node);
  seed = sf_seed_mix(seed, s->epoch);
  seed = sf_seed_mix(seed, s->pass);
  seed = sf_seed_mix(seed, s->shard_index);
  seed = sf_seed_mix(seed, s->index);
  sf_rng rng;
  sf_rng_seed(&rng, seed);
  return (int64_t)sf_rng_below(&rng, (uint64_t)(have - want + 1));
}

/* Decodes field f of sample s into float32 [channels, frames] and appends "<name>.length". */
static int decode_field(sf_node *node, sf_sample *s, sf_field *f, failure *why) {
  const audio *a = sf_node_priv(node);
  sf_tensor *t = &f->tensor;
  if (t->dtype != SF_DTYPE_UINT8 || t->ndim != 1 || !t->buffer || !sf_tensor_is_contiguous(t))
    return fail(why, SF_EINVAL, "%s", "is marked encoded but does not hold bytes");
  char length_name[SF_FIELD_NAME_MAX + 8];
  snprintf(length_name, sizeof length_name, "%s.length", f->name);
  if (strlen(length_name) >= SF_FIELD_NAME_MAX || sf_sample_field(s, length_name) || s->n_fields >= SF_MAX_FIELDS)
    return fail(why, SF_EDUP, "cannot add field %s (too long, already there, or the sample is full)",
                length_name);
  static const int codes[] = {[AUDIO_PCM_FORMAT] = SF_EFORMAT, [AUDIO_PCM_TOO_BIG] = SF_ETOOBIG,
                              [AUDIO_PCM_NOMEM] = SF_ENOMEM};
  audio_pcm pcm;
  int r = audio_pcm_read(sf_tensor_data(t), (size_t)t->shape[0], a->max_samples, &pcm, why->text, sizeof why->text);
  if (r != AUDIO_PCM_OK) return why->code = codes[r];
  int64_t original = pcm.frames;
  if (a->sample_rate > 0 && a->sample_rate != pcm.rate && (r = resample(a, &pcm, why)) < 0) {
    free(pcm.data);
    return r;
  }
  int64_t have = pcm.frames, want = a->frames > 0 ? a->frames : have, channels = pcm.channels;
  if ((double)want * channels > (double)a->max_samples) {
    free(pcm.data);
    char detail[96];
    snprintf(detail, sizeof detail, "frames (%lld) x %lld channels", (long long)want, (long long)channels);
    return fail(why, SF_ETOOBIG, "option %s is more than max_samples: lower frames or raise max_samples", detail);
  }
  int64_t from = have > want ? crop_start(a, node, s, have, want) : 0;
  sf_tensor out, length;
  const int64_t shape[2] = {channels, want};
  if (sf_tensor_alloc(&out, SF_DTYPE_FLOAT32, 2, shape) < 0) {
    free(pcm.data);
    return fail(why, SF_ENOMEM, "%s", "cannot allocate the output tensor");
  }
  if (sf_tensor_alloc(&length, SF_DTYPE_INT64, 0, NULL) < 0) {
    sf_tensor_clear(&out);
    free(pcm.data);
    return fail(why, SF_ENOMEM, "%s", "cannot allocate the length field");
  }
  /* Interleaved [frames, channels] to planar [channels, frames], zero-padded at the end. */
  float *dst = sf_tensor_data(&out);
  int64_t copied = have - from < want ? have - from : want;
  for (int64_t c = 0; c < channels; c++) {
    for (int64_t i = 0; i < copied; i++) dst[c * want + i] = pcm.data[(from + i) * channels + c];
    memset(dst + c * want + copied, 0, (size_t)(want - copied) * sizeof(float));
  }
  free(pcm.data);
  *(int64_t *)sf_tensor_data(&length) = original;
  sf_tensor_clear(t);
  *t = out;
  f->encoded = false;
  sf_sample_add_field(s, length_name, false, &length); /* room checked above */
  return 0;
}

static int map(sf_node *node, sf_sample **ps) {
  const audio *a = sf_node_priv(node);
  sf_sample *s = *ps;
  int n = s->n_fields; /* the .length fields appended below are not decoded again */
  for (int i = 0; i < n; i++) {
    sf_field *f = &s->fields[i];
    failure why = {0};
    if (f->encoded && wanted(a->fields, f->name) && decode_field(node, s, f, &why) < 0) {
      sf_node_error(node, why.code, sf_sample_url(s), s->key, s->offset, "field %s: %s", f->name, why.text);
      return why.code;
    }
  }
  return 0;
}

static const sf_stage_def audio_decode = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "audio_decode",
    .summary = "decodes WAV/FLAC/OGG fields (libsndfile) to float32 [channels,frames], resamples (libsamplerate), "
               "crops/pads to a fixed length and adds <field>.length (int64, frames as stored)",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP,
    .priv_size = sizeof(audio),
    .options = options,
    .map = map,
};

static const sf_stage_def *const stages[] = {&audio_decode, NULL};

static const sf_plugin plugin = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "audio",
    .build_id = "audio " SF_AUDIO_VERSION " (libsndfile, libsamplerate)",
    .stages = stages,
};

/**
 * The plugin's entry point (see shardflow/plugin.h): one stage, audio_decode.
 * Returns static data the loader borrows for the life of the process.
 */
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void);
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void) { return &plugin; }
