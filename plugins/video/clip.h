/* The video plugin's member reader: one video held in memory, demuxed and decoded with libavformat/libavcodec,
 * frames converted to RGB with libswscale. Knows nothing of shardflow's stages (the fuzz target uses it alone). */
#ifndef SF_VIDEO_CLIP_H
#define SF_VIDEO_CLIP_H

#include <stddef.h>
#include <stdint.h>

/** Results of the reader's functions. */
enum {
  VIDEO_OK = 0,
  VIDEO_FORMAT = -1,  /* damaged, truncated, unsupported container or codec: the message says which */
  VIDEO_TOO_BIG = -2, /* the clip would exceed the memory bound */
  VIDEO_NOMEM = -3,
  VIDEO_NO_AUDIO = -4, /* video_decode_audio: the member has no audio stream */
};

/** Limits of one reader, from the stage's options. */
typedef struct video_limits {
  int threads;            /* decoder threads (libavcodec's thread_count), >= 1 */
  int64_t max_clip_bytes; /* largest T x H x W x 3 accepted; also bounds one decoded frame's pixels */
  const char *containers; /* libavformat demuxer names allowed, comma-separated (format_whitelist) */
} video_limits;

typedef struct video_reader video_reader;

/** What the index pass learnt of the video stream. Borrowed from the reader. */
typedef struct video_info {
  const char *codec; /* libavcodec's name of the stream's codec ("h264", "vp9") */
  int width, height; /* the stream's size: every output frame is converted to it */
  int64_t frames;    /* frames in presentation order (distinct timestamps of the stream's packets) */
} video_info;

/**
 * Opens the size bytes at data (borrowed: they must outlive the reader) through an in-memory AVIOContext,
 * finds the best video stream and demuxes it once to index its frames (timestamps and keyframes; no decoding).
 * Returns VIDEO_OK with *out set (free with video_close), or a VIDEO_* error with why filled in (nothing to
 * free). The codec's name, when known, is in why.
 */
int video_open(video_reader **out, const uint8_t *data, size_t size, const video_limits *limits, char *why,
               size_t why_len);

/** The stream's codec, size and frame count. */
const video_info *video_get_info(const video_reader *r);

/** Presentation time of frame i (0 <= i < frames) in seconds, as PyAV's frame.time. */
double video_frame_time(const video_reader *r, int64_t i);

/**
 * Decodes frames idx[0..n-1] (ascending, repeats allowed, each in 0..frames-1) into rgb (n x height x width x 3
 * bytes, row-major) and their times (seconds) into pts. For each run of wanted frames it seeks to the keyframe
 * at or before the first, and decodes only from there. *decoded (may be NULL) gets the frames the decoder
 * produced, wanted or not. Returns VIDEO_OK or a VIDEO_* error with why filled in (rgb then undefined).
 */
int video_decode(video_reader *r, const int64_t *idx, int n, uint8_t *rgb, double *pts, int64_t *decoded, char *why,
                 size_t why_len);

/**
 * Duration of frame i in seconds: to the next frame's time; for the last frame the mean interval of the video's
 * frames (1/avg_frame_rate for a one-frame video, 0 when the stream has no rate).
 */
double video_frame_duration(const video_reader *r, int64_t i);

/** A clip's audio: planar float32, channel c's samples at samples + c * frames. */
typedef struct video_audio {
  float *samples; /* malloc'd (the caller frees it); NULL when frames is 0 */
  int channels;
  int rate;       /* Hz: the stream's own rate, not resampled */
  int64_t frames; /* samples per channel */
} video_audio;

/**
 * Decodes the member's audio stream (libavformat's best one for the video stream) from its start (so that every
 * codec's state, AAC's overlap or MP3's bit reservoir, is a whole decode's) up to time t1, and keeps the samples
 * in [t0, t0 + frames/rate), frames = round((t1 - t0) * rate): sample k is the stream's sample at time t0 + k/rate
 * (times from each decoded frame's pts), zeros where the track has none. Planar float by libswresample (a copy
 * when the decoder's output already is). frames x channels x 4 bytes is bounded by the reader's max_clip_bytes.
 * Rewinds the demuxer: the reader's video position is lost (call it after video_decode). Returns VIDEO_OK with
 * *out filled, VIDEO_NO_AUDIO, or another VIDEO_* error with why filled in (*out then empty).
 */
int video_decode_audio(video_reader *r, double t0, double t1, video_audio *out, char *why, size_t why_len);

/** Frees the reader and sets *r to NULL. NULL-safe. */
void video_close(video_reader **r);

#endif
