/* The video plugin's member reader: an in-memory AVIOContext, a demux pass that indexes the frames, keyframe
 * seeks and decoding of just the frames a clip needs, RGB by libswscale. */
#include "clip.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/parseutils.h>
#include <libavutil/pixdesc.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>

/* The bytes of one member, read by libavformat through avio (borrowed from the sample's field). */
typedef struct mem_io {
  const uint8_t *data;
  size_t size, pos;
} mem_io;

struct video_reader {
  mem_io io;
  video_limits limits;
  AVIOContext *avio;
  AVFormatContext *fmt;
  AVCodecContext *dec;
  const AVCodec *codec;
  struct SwsContext *sws;
  AVPacket *pkt;
  AVFrame *frame;
  int stream;
  AVRational time_base;
  AVRational frame_rate; /* the stream's avg_frame_rate when opened (a rewind may reopen it without streams) */
  int64_t *pts, n_pts;   /* distinct frame timestamps, ascending: frame i is pts[i] */
  int64_t *keys, n_keys; /* keyframe timestamps, ascending */
  bool draining;         /* the demuxer ended and the decoder was told so */
  video_info info;
  char codec_name[32];
  char last_error[160]; /* libav's last error line logged on this thread, for the error record */
};

/* ---- libav's log: its error lines go into the reader's error record, not to stderr --------------------------- */

static _Thread_local char *log_target; /* the reader's last_error while one of its calls runs on this thread */
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_line(void *avcl, int level, const char *fmt, va_list ap) {
  char *to = log_target;
  if (!to) { /* another user of libav in this process, or a decoder thread: as libav would */
    av_log_default_callback(avcl, level, fmt, ap);
    return;
  }
  if (level > AV_LOG_ERROR) return;
  char line[160];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == '.'))
    line[--n] = '\0';
  if (n) snprintf(to, 160, "%s", line);
}

static void log_setup(void) { av_log_set_callback(log_line); }

static int fail(video_reader *r, char *why, size_t why_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int fail(video_reader *r, char *why, size_t why_len, int code, const char *fmt, ...) {
  char text[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  const char *codec = r && r->codec_name[0] ? r->codec_name : "unknown";
  if (r && r->last_error[0])
    snprintf(why, why_len, "codec %s: %s (libav: %s)", codec, text, r->last_error);
  else
    snprintf(why, why_len, "codec %s: %s", codec, text);
  return code;
}

static const char *av_text(int e, char *buf, size_t n) {
  av_strerror(e, buf, n);
  return buf;
}

/* ---- the in-memory AVIOContext -------------------------------------------------------------------------------- */

static int mem_read(void *opaque, uint8_t *buf, int n) {
  mem_io *m = opaque;
  size_t left = m->size - m->pos;
  if (!left) return AVERROR_EOF;
  if (n < 0) return AVERROR(EINVAL);
  if ((size_t)n > left) n = (int)left;
  memcpy(buf, m->data + m->pos, (size_t)n);
  m->pos += (size_t)n;
  return n;
}

static int64_t mem_seek(void *opaque, int64_t offset, int whence) {
  mem_io *m = opaque;
  whence &= ~AVSEEK_FORCE;
  if (whence == AVSEEK_SIZE) return (int64_t)m->size;
  int64_t base = whence == SEEK_SET   ? 0
                 : whence == SEEK_CUR ? (int64_t)m->pos
                 : whence == SEEK_END ? (int64_t)m->size
                                      : -1;
  if (base < 0) return AVERROR(EINVAL);
  if ((offset > 0 && offset > INT64_MAX - base) || base + offset < 0 || base + offset > (int64_t)m->size)
    return AVERROR(EINVAL);
  m->pos = (size_t)(base + offset);
  return base + offset;
}

/* A member is one file: a playlist or reference inside it (HLS, concat, mov's external data references) must
 * not make libavformat open other files or URLs (with the protocol whitelist below). */
static int refuse_open(AVFormatContext *s, AVIOContext **pb, const char *url, int flags, AVDictionary **options) {
  return AVERROR(EPERM);
}

static void close_format(video_reader *r) {
  avformat_close_input(&r->fmt);
  if (r->avio) av_freep(&r->avio->buffer);
  avio_context_free(&r->avio);
}

/* Opens the demuxer on the member from its first byte (again, to rewind). */
static int open_format(video_reader *r, char *why, size_t why_len) {
  close_format(r);
  r->io.pos = 0;
  r->draining = false;
  enum { IO_BUFFER = 32768 };
  uint8_t *buffer = av_malloc(IO_BUFFER);
  if (!buffer || !(r->avio = avio_alloc_context(buffer, IO_BUFFER, 0, &r->io, mem_read, NULL, mem_seek))) {
    av_free(buffer);
    return fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the reader");
  }
  AVFormatContext *fmt = avformat_alloc_context();
  if (!fmt) return fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the demuxer");
  fmt->pb = r->avio;
  fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
  fmt->io_open = refuse_open;
  /* Demuxers that open nested files in contexts of their own (concat) copy this list into them: no protocol is
   * named "none", so they open nothing either. The member itself is read through avio, no protocol. */
  if (!(fmt->protocol_whitelist = av_strdup("none"))) {
    avformat_free_context(fmt);
    return fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the demuxer");
  }
  if (r->limits.containers && *r->limits.containers && !(fmt->format_whitelist = av_strdup(r->limits.containers))) {
    avformat_free_context(fmt);
    return fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the demuxer");
  }
  char e[AV_ERROR_MAX_STRING_SIZE];
  int ret = avformat_open_input(&fmt, NULL, NULL, NULL); /* frees fmt on failure */
  if (ret < 0)
    return fail(r, why, why_len, VIDEO_FORMAT, "no container this reader takes (allowed: %s): %s",
                r->limits.containers && *r->limits.containers ? r->limits.containers : "any",
                av_text(ret, e, sizeof e));
  r->fmt = fmt;
  return VIDEO_OK;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static int push(int64_t **v, int64_t *n, int64_t *cap, int64_t x) {
  if (*n == *cap) {
    int64_t c = *cap ? *cap * 2 : 256;
    int64_t *p = realloc(*v, (size_t)c * sizeof **v);
    if (!p) return -1;
    *v = p;
    *cap = c;
  }
  (*v)[(*n)++] = x;
  return 0;
}

/* Sorts and drops repeated values; returns the new count. */
static int64_t sort_unique(int64_t *v, int64_t n) {
  if (n == 0) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_i64);
  int64_t m = 1;
  for (int64_t i = 1; i < n; i++)
    if (v[i] != v[m - 1]) v[m++] = v[i];
  return m;
}

/* Demuxes the whole member once (no decoding): every packet of the stream is one frame, at its timestamp. */
static int build_index(video_reader *r, char *why, size_t why_len) {
  int64_t cap = 0, key_cap = 0, packets = 0;
  char e[AV_ERROR_MAX_STRING_SIZE];
  for (;;) {
    int ret = av_read_frame(r->fmt, r->pkt);
    if (ret == AVERROR_EOF) break;
    if (ret < 0)
      return fail(r, why, why_len, VIDEO_FORMAT, "damaged container after %lld frames: %s", (long long)packets,
                  av_text(ret, e, sizeof e));
    if (r->pkt->stream_index == r->stream) {
      int64_t ts = r->pkt->pts != AV_NOPTS_VALUE ? r->pkt->pts : r->pkt->dts;
      bool key = r->pkt->flags & AV_PKT_FLAG_KEY;
      bool corrupt = r->pkt->flags & AV_PKT_FLAG_CORRUPT;
      av_packet_unref(r->pkt);
      if (corrupt)
        return fail(r, why, why_len, VIDEO_FORMAT, "damaged or truncated: packet %lld is incomplete",
                    (long long)packets);
      if (ts == AV_NOPTS_VALUE)
        return fail(r, why, why_len, VIDEO_FORMAT, "packet %lld has no timestamp", (long long)packets);
      if (push(&r->pts, &r->n_pts, &cap, ts) < 0 || (key && push(&r->keys, &r->n_keys, &key_cap, ts) < 0))
        return fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the frame index");
      packets++;
    } else {
      av_packet_unref(r->pkt);
    }
  }
  r->n_pts = sort_unique(r->pts, r->n_pts);
  r->n_keys = sort_unique(r->keys, r->n_keys);
  if (r->n_pts == 0) return fail(r, why, why_len, VIDEO_FORMAT, "the video stream has no frames");
  AVStream *st = r->fmt->streams[r->stream];
  /* A container that lists its frames (MP4's sample table) and delivered fewer was cut short. */
  if (st->nb_frames > 0 && packets < st->nb_frames)
    return fail(r, why, why_len, VIDEO_FORMAT, "truncated: the container lists %lld frames, %lld could be read",
                (long long)st->nb_frames, (long long)packets);
  if (st->nb_frames <= 0 && r->n_pts > 1) {
    /* Other containers (Matroska, WebM) end early without a word from the demuxer: compare the frames' span with
     * the duration the container declares for this stream (its own, a DURATION tag as FFmpeg and mkvmerge write,
     * or the whole file's when the stream is alone). Losing more than a frame and a half is refused. */
    int64_t declared_us = AV_NOPTS_VALUE;
    const AVDictionaryEntry *tag = av_dict_get(st->metadata, "DURATION", NULL, 0);
    if (st->duration != AV_NOPTS_VALUE && st->duration > 0)
      declared_us = av_rescale_q(st->duration, r->time_base, AV_TIME_BASE_Q);
    else if (tag && av_parse_time(&declared_us, tag->value, 1) < 0)
      declared_us = AV_NOPTS_VALUE;
    else if (!tag && r->fmt->nb_streams == 1 && r->fmt->duration > 0)
      declared_us = r->fmt->duration;
    double tb = av_q2d(r->time_base);
    double first = (double)r->pts[0] * tb, last = (double)r->pts[r->n_pts - 1] * tb;
    double frame = (last - first) / (double)(r->n_pts - 1);
    if (declared_us != AV_NOPTS_VALUE && declared_us > 0 && last + frame < first + declared_us / 1e6 - 1.5 * frame)
      return fail(r, why, why_len, VIDEO_FORMAT, "truncated: the container declares %.3fs, its frames end at %.3fs",
                  declared_us / 1e6, last + frame - first);
  }
  if (r->n_keys == 0 || r->keys[0] > r->pts[0]) { /* decoding starts at the first packet whatever its flag */
    if (push(&r->keys, &r->n_keys, &key_cap, r->pts[0]) < 0)
      return fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the frame index");
    r->n_keys = sort_unique(r->keys, r->n_keys);
  }
  return VIDEO_OK;
}

static int open_decoder(video_reader *r, char *why, size_t why_len) {
  AVStream *st = r->fmt->streams[r->stream];
  char e[AV_ERROR_MAX_STRING_SIZE];
  if (!(r->dec = avcodec_alloc_context3(r->codec)))
    return fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the decoder");
  int ret = avcodec_parameters_to_context(r->dec, st->codecpar);
  if (ret < 0) return fail(r, why, why_len, VIDEO_FORMAT, "bad codec parameters: %s", av_text(ret, e, sizeof e));
  r->dec->thread_count = r->limits.threads;
  r->dec->thread_type = FF_THREAD_FRAME | FF_THREAD_SLICE;
  r->dec->pkt_timebase = st->time_base;
  /* No decoded frame larger than the clip bound: libavcodec refuses it before allocating. */
  int64_t pixels = r->limits.max_clip_bytes / 3;
  r->dec->max_pixels = pixels > INT_MAX ? INT_MAX : pixels < 1 ? 1 : pixels;
  if ((ret = avcodec_open2(r->dec, r->codec, NULL)) < 0)
    return fail(r, why, why_len, VIDEO_FORMAT, "the decoder does not open: %s", av_text(ret, e, sizeof e));
  return VIDEO_OK;
}

static int open_all(video_reader *r, char *why, size_t why_len) {
  int ret = open_format(r, why, why_len);
  if (ret < 0) return ret;
  char e[AV_ERROR_MAX_STRING_SIZE];
  /* Containers without a header (MPEG-TS) name their streams only while read. */
  bool probed = r->fmt->nb_streams == 0 || (r->fmt->ctx_flags & AVFMTCTX_NOHEADER);
  if (probed) {
    if ((ret = avformat_find_stream_info(r->fmt, NULL)) < 0)
      return fail(r, why, why_len, VIDEO_FORMAT, "no stream information: %s", av_text(ret, e, sizeof e));
  }
  for (unsigned i = 0; i < r->fmt->nb_streams; i++) { /* only the video stream's packets are read */
    AVCodecParameters *p = r->fmt->streams[i]->codecpar;
    if (p->codec_type != AVMEDIA_TYPE_VIDEO) r->fmt->streams[i]->discard = AVDISCARD_ALL;
  }
  ret = av_find_best_stream(r->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, &r->codec, 0);
  if (ret == AVERROR_STREAM_NOT_FOUND)
    return fail(r, why, why_len, VIDEO_FORMAT, "no video stream in the %s container", r->fmt->iformat->name);
  if (ret >= 0 || ret == AVERROR_DECODER_NOT_FOUND) {
    /* The stream is known from here on, decodable or not: its codec names the error records. */
    int s = ret >= 0 ? ret : av_find_best_stream(r->fmt, AVMEDIA_TYPE_VIDEO, -1, -1, NULL, 0);
    if (s >= 0)
      snprintf(r->codec_name, sizeof r->codec_name, "%s", avcodec_get_name(r->fmt->streams[s]->codecpar->codec_id));
  }
  if (ret == AVERROR_DECODER_NOT_FOUND || (ret >= 0 && !r->codec))
    return fail(r, why, why_len, VIDEO_FORMAT, "this libavcodec has no decoder for it");
  if (ret < 0) return fail(r, why, why_len, VIDEO_FORMAT, "no video stream: %s", av_text(ret, e, sizeof e));
  r->stream = ret;
  AVStream *st = r->fmt->streams[ret];
  r->time_base = st->time_base;
  r->frame_rate = st->avg_frame_rate;
  if (st->codecpar->width <= 0 || st->codecpar->height <= 0) { /* once only: a second call crashes libavformat */
    if (probed || (ret = avformat_find_stream_info(r->fmt, NULL)) < 0 || st->codecpar->width <= 0 ||
        st->codecpar->height <= 0)
      return fail(r, why, why_len, VIDEO_FORMAT, "the stream's frame size is unknown");
  }
  if (r->time_base.num <= 0 || r->time_base.den <= 0)
    return fail(r, why, why_len, VIDEO_FORMAT, "the stream has no time base");
  r->info.width = st->codecpar->width;
  r->info.height = st->codecpar->height;
  return VIDEO_OK;
}

int video_open(video_reader **out, const uint8_t *data, size_t size, const video_limits *limits, char *why,
               size_t why_len) {
  *out = NULL;
  pthread_once(&log_once, log_setup);
  video_reader *r = calloc(1, sizeof *r);
  if (!r) return fail(NULL, why, why_len, VIDEO_NOMEM, "out of memory for the reader");
  r->io = (mem_io){.data = data, .size = size};
  r->limits = *limits;
  if (r->limits.threads < 1) r->limits.threads = 1;
  r->info.codec = r->codec_name;
  log_target = r->last_error;
  int ret = (r->pkt = av_packet_alloc()) && (r->frame = av_frame_alloc())
                ? VIDEO_OK
                : fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the reader");
  if (ret == VIDEO_OK) ret = open_all(r, why, why_len);
  if (ret == VIDEO_OK) {
    int64_t frame_bytes = (int64_t)r->info.width * r->info.height * 3;
    if (frame_bytes > r->limits.max_clip_bytes)
      ret = fail(r, why, why_len, VIDEO_TOO_BIG, "one %dx%d frame is %lld bytes, more than max_clip_bytes",
                 r->info.width, r->info.height, (long long)frame_bytes);
  }
  if (ret == VIDEO_OK) ret = build_index(r, why, why_len);
  if (ret == VIDEO_OK) ret = open_decoder(r, why, why_len);
  log_target = NULL;
  if (ret < 0) {
    video_close(&r);
    return ret;
  }
  r->info.frames = r->n_pts;
  *out = r;
  return VIDEO_OK;
}

const video_info *video_get_info(const video_reader *r) { return &r->info; }

double video_frame_time(const video_reader *r, int64_t i) { return (double)r->pts[i] * av_q2d(r->time_base); }

/* The last frame whose timestamp is <= ts, or -1 before the first. */
static int64_t frame_at(const int64_t *v, int64_t n, int64_t ts) {
  int64_t lo = 0, hi = n; /* first index with v[i] > ts */
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (v[mid] <= ts)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - 1;
}

/* Positions the demuxer and decoder so the next frames decoded start at the keyframe at or before ts. */
static int seek_to(video_reader *r, int64_t ts, bool rewind, char *why, size_t why_len) {
  int64_t k = frame_at(r->keys, r->n_keys, ts);
  avcodec_flush_buffers(r->dec);
  r->draining = false;
  if (rewind || k <= 0 || av_seek_frame(r->fmt, r->stream, r->keys[k], AVSEEK_FLAG_BACKWARD) < 0) {
    int ret = open_format(r, why, why_len); /* from the first byte: always possible in memory */
    if (ret < 0) return ret;
    for (unsigned i = 0; i < r->fmt->nb_streams; i++)
      if ((int)i != r->stream) r->fmt->streams[i]->discard = AVDISCARD_ALL;
    if ((unsigned)r->stream >= r->fmt->nb_streams)
      return fail(r, why, why_len, VIDEO_FORMAT, "the stream changed when read again");
  }
  return VIDEO_OK;
}

/* The decoder's next frame: 1 with r->frame and *ts set, 0 at the end of the stream, or a VIDEO_* error. */
static int next_frame(video_reader *r, int64_t *ts, char *why, size_t why_len) {
  char e[AV_ERROR_MAX_STRING_SIZE];
  for (;;) {
    av_frame_unref(r->frame);
    int ret = avcodec_receive_frame(r->dec, r->frame);
    if (ret == 0) {
      *ts = r->frame->pts != AV_NOPTS_VALUE ? r->frame->pts : r->frame->best_effort_timestamp;
      return 1;
    }
    if (ret == AVERROR_EOF) return 0;
    if (ret != AVERROR(EAGAIN))
      return fail(r, why, why_len, VIDEO_FORMAT, "damaged stream: %s", av_text(ret, e, sizeof e));
    if (r->draining) return 0;
    ret = av_read_frame(r->fmt, r->pkt);
    if (ret == AVERROR_EOF) {
      r->draining = true;
      avcodec_send_packet(r->dec, NULL);
      continue;
    }
    if (ret < 0) return fail(r, why, why_len, VIDEO_FORMAT, "damaged container: %s", av_text(ret, e, sizeof e));
    if (r->pkt->stream_index != r->stream) {
      av_packet_unref(r->pkt);
      continue;
    }
    ret = avcodec_send_packet(r->dec, r->pkt);
    av_packet_unref(r->pkt);
    if (ret < 0 && ret != AVERROR(EAGAIN))
      return fail(r, why, why_len, VIDEO_FORMAT, "damaged stream: %s", av_text(ret, e, sizeof e));
  }
}

/* Converts r->frame to packed RGB of the stream's size at dst. */
static int convert(video_reader *r, uint8_t *dst, char *why, size_t why_len) {
  const AVFrame *f = r->frame;
  int w = r->info.width, h = r->info.height;
  if (f->width <= 0 || f->height <= 0 || f->format < 0)
    return fail(r, why, why_len, VIDEO_FORMAT, "the decoder gave a frame without size or pixel format");
  r->sws = sws_getCachedContext(r->sws, f->width, f->height, f->format, w, h, AV_PIX_FMT_RGB24, SWS_BILINEAR, NULL,
                                NULL, NULL);
  if (!r->sws)
    return fail(r, why, why_len, VIDEO_FORMAT, "libswscale cannot convert %s %dx%d to rgb24",
                av_get_pix_fmt_name(f->format) ? av_get_pix_fmt_name(f->format) : "?", f->width, f->height);
  /* The frame's own matrix and range where it says them; untagged frames keep libswscale's defaults (BT.601,
   * the range of the pixel format), as PyAV and the ffmpeg CLI convert them. */
  if ((f->colorspace != AVCOL_SPC_UNSPECIFIED && f->colorspace != AVCOL_SPC_RGB) ||
      f->color_range == AVCOL_RANGE_JPEG) {
    int *inv, *table, src_range, dst_range, brightness, contrast, saturation;
    if (sws_getColorspaceDetails(r->sws, &inv, &src_range, &table, &dst_range, &brightness, &contrast, &saturation) >=
        0) {
      const int *coefficients = f->colorspace != AVCOL_SPC_UNSPECIFIED ? sws_getCoefficients(f->colorspace) : inv;
      sws_setColorspaceDetails(r->sws, coefficients, f->color_range == AVCOL_RANGE_JPEG ? 1 : src_range, table,
                               dst_range, brightness, contrast, saturation);
    }
  }
  uint8_t *planes[4] = {dst, NULL, NULL, NULL};
  int strides[4] = {w * 3, 0, 0, 0};
  if (sws_scale(r->sws, (const uint8_t *const *)f->data, f->linesize, 0, f->height, planes, strides) != h)
    return fail(r, why, why_len, VIDEO_FORMAT, "libswscale failed on a %s frame",
                av_get_pix_fmt_name(f->format) ? av_get_pix_fmt_name(f->format) : "?");
  return VIDEO_OK;
}

static int decode_frames(video_reader *r, const int64_t *idx, int n, uint8_t *rgb, double *pts, int64_t *decoded,
                         char *why, size_t why_len) {
  size_t frame_bytes = (size_t)r->info.width * (size_t)r->info.height * 3;
  int pos = 0, ret;
  int64_t cur = -1;           /* index of the last frame the decoder gave since the last seek */
  bool positioned = false;    /* the last seek was for the run that idx[pos] belongs to */
  bool rewound = false;       /* a seek that landed after its frame was retried from the start once */
  bool fresh = false;         /* no frame decoded since the last seek */
  int64_t sought = INT64_MIN; /* the keyframe the last seek was for */
  while (pos < n) {
    int64_t want = idx[pos];
    if (want < 0 || want >= r->n_pts)
      return fail(r, why, why_len, VIDEO_FORMAT, "frame %lld is outside the video", (long long)want);
    int64_t k = frame_at(r->keys, r->n_keys, r->pts[want]);
    int64_t key = r->keys[k < 0 ? 0 : k];
    /* Seek when a keyframe lies between what was decoded and the frame wanted: decoding up to it is waste. Once
     * per keyframe: a demuxer whose index is coarser (WebM cues on some keyframes only) lands before it, and
     * decoding on from there is right. */
    if (!positioned || (key > sought && cur >= 0 && key > r->pts[cur] && cur < want)) {
      if ((ret = seek_to(r, r->pts[want], false, why, why_len)) < 0) return ret;
      positioned = fresh = true;
      sought = key;
      cur = -1;
    }
    int64_t ts = AV_NOPTS_VALUE;
    ret = next_frame(r, &ts, why, why_len);
    if (ret < 0) return ret;
    if (ret == 0)
      return fail(r, why, why_len, VIDEO_FORMAT, "damaged stream: frame %lld (%.3fs) never came out of the decoder",
                  (long long)want, video_frame_time(r, want));
    if (decoded) (*decoded)++;
    int64_t fi = ts == AV_NOPTS_VALUE ? cur + 1 : frame_at(r->pts, r->n_pts, ts);
    bool was_fresh = fresh;
    fresh = false;
    if (fi < 0) continue; /* before the first indexed frame (an open GOP's leading pictures) */
    cur = fi;
    if (fi < want) continue;
    if (fi > want) {
      if (was_fresh && !rewound) { /* the seek landed after the keyframe it was asked for: from the start */
        rewound = true;
        if ((ret = seek_to(r, r->pts[want], true, why, why_len)) < 0) return ret;
        fresh = true;
        cur = -1;
        continue;
      }
      return fail(r, why, why_len, VIDEO_FORMAT, "damaged stream: frame %lld (%.3fs) is missing", (long long)want,
                  video_frame_time(r, want));
    }
    for (; pos < n && idx[pos] == fi; pos++) {
      if ((ret = convert(r, rgb + (size_t)pos * frame_bytes, why, why_len)) < 0) return ret;
      pts[pos] = video_frame_time(r, fi);
    }
  }
  return VIDEO_OK;
}

int video_decode(video_reader *r, const int64_t *idx, int n, uint8_t *rgb, double *pts, int64_t *decoded, char *why,
                 size_t why_len) {
  for (int i = 1; i < n; i++)
    if (idx[i] < idx[i - 1]) return fail(r, why, why_len, VIDEO_FORMAT, "frames asked for out of order");
  if (decoded) *decoded = 0;
  r->last_error[0] = '\0';
  log_target = r->last_error;
  int ret = decode_frames(r, idx, n, rgb, pts, decoded, why, why_len);
  log_target = NULL;
  return ret;
}

double video_frame_duration(const video_reader *r, int64_t i) {
  if (i + 1 < r->n_pts) return video_frame_time(r, i + 1) - video_frame_time(r, i);
  if (r->n_pts > 1) return (video_frame_time(r, r->n_pts - 1) - video_frame_time(r, 0)) / (double)(r->n_pts - 1);
  /* From the reader, not r->fmt: after a rewind (seek_to) a container without a header (MPEG-TS) has no streams
   * until read again. */
  AVRational rate = r->frame_rate;
  return rate.num > 0 && rate.den > 0 ? av_q2d(av_inv_q(rate)) : 0.0;
}

/* ---- the audio track ------------------------------------------------------------------------------------------- */

/* What one audio decode holds: freed by audio_end whatever happened. */
typedef struct audio_pass {
  AVCodecContext *dec;
  SwrContext *swr;
  int swr_format;  /* the sample format swr was set up for */
  float *scratch;  /* one frame converted to planar float */
  int64_t scratch_frames;
} audio_pass;

static void audio_end(audio_pass *a) {
  avcodec_free_context(&a->dec);
  swr_free(&a->swr);
  free(a->scratch);
}

/* Opens the demuxer again from the first byte on the best audio stream, and its decoder; *stream gets its index. */
static int audio_open(video_reader *r, audio_pass *a, int *stream, char *why, size_t why_len) {
  char e[AV_ERROR_MAX_STRING_SIZE];
  int ret = open_format(r, why, why_len);
  if (ret < 0) return ret;
  if ((r->fmt->nb_streams == 0 || (r->fmt->ctx_flags & AVFMTCTX_NOHEADER)) &&
      (ret = avformat_find_stream_info(r->fmt, NULL)) < 0)
    return fail(r, why, why_len, VIDEO_FORMAT, "no stream information: %s", av_text(ret, e, sizeof e));
  const AVCodec *codec = NULL;
  int related = (unsigned)r->stream < r->fmt->nb_streams ? r->stream : -1;
  int s = av_find_best_stream(r->fmt, AVMEDIA_TYPE_AUDIO, -1, related, &codec, 0);
  if (s == AVERROR_STREAM_NOT_FOUND)
    return fail(r, why, why_len, VIDEO_NO_AUDIO, "no audio stream in the %s container", r->fmt->iformat->name);
  if (s == AVERROR_DECODER_NOT_FOUND || (s >= 0 && !codec)) {
    int any = av_find_best_stream(r->fmt, AVMEDIA_TYPE_AUDIO, -1, related, NULL, 0);
    return fail(r, why, why_len, VIDEO_FORMAT, "this libavcodec has no decoder for the audio stream (%s)",
                any >= 0 ? avcodec_get_name(r->fmt->streams[any]->codecpar->codec_id) : "?");
  }
  if (s < 0) return fail(r, why, why_len, VIDEO_FORMAT, "no audio stream: %s", av_text(s, e, sizeof e));
  for (unsigned i = 0; i < r->fmt->nb_streams; i++) /* only the audio stream's packets are read */
    r->fmt->streams[i]->discard = (int)i == s ? AVDISCARD_DEFAULT : AVDISCARD_ALL;
  AVStream *st = r->fmt->streams[s];
  if (!(a->dec = avcodec_alloc_context3(codec)))
    return fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the audio decoder");
  if ((ret = avcodec_parameters_to_context(a->dec, st->codecpar)) < 0)
    return fail(r, why, why_len, VIDEO_FORMAT, "bad audio codec parameters (%s): %s", codec->name,
                av_text(ret, e, sizeof e));
  a->dec->pkt_timebase = st->time_base;
  a->dec->thread_count = 1;
  if ((ret = avcodec_open2(a->dec, codec, NULL)) < 0)
    return fail(r, why, why_len, VIDEO_FORMAT, "the audio decoder (%s) does not open: %s", codec->name,
                av_text(ret, e, sizeof e));
  if (st->time_base.num <= 0 || st->time_base.den <= 0)
    return fail(r, why, why_len, VIDEO_FORMAT, "the audio stream has no time base");
  *stream = s;
  return VIDEO_OK;
}

/* The frame's samples as planar float: its own planes when they are, else converted by libswresample into the
 * pass's scratch. planes[c] gets channel c's nb_samples values. */
static int audio_planes(video_reader *r, audio_pass *a, AVFrame *f, const float **planes, char *why,
                        size_t why_len) {
  int channels = f->ch_layout.nb_channels;
  if (f->format == AV_SAMPLE_FMT_FLTP) {
    for (int c = 0; c < channels; c++)
      planes[c] = (const float *)f->extended_data[c];
    return VIDEO_OK;
  }
  if (!a->swr || a->swr_format != f->format) {
    swr_free(&a->swr);
    a->swr_format = f->format;
    if (swr_alloc_set_opts2(&a->swr, &f->ch_layout, AV_SAMPLE_FMT_FLTP, f->sample_rate, &f->ch_layout, f->format,
                            f->sample_rate, 0, NULL) < 0 ||
        swr_init(a->swr) < 0)
      return fail(r, why, why_len, VIDEO_FORMAT, "libswresample cannot convert %s audio to planar float",
                  av_get_sample_fmt_name(f->format) ? av_get_sample_fmt_name(f->format) : "?");
  }
  if (f->nb_samples > a->scratch_frames) {
    float *p = realloc(a->scratch, (size_t)f->nb_samples * (size_t)channels * sizeof *p);
    if (!p) return fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the audio");
    a->scratch = p;
    a->scratch_frames = f->nb_samples;
  }
  uint8_t *out[64];
  for (int c = 0; c < channels; c++) {
    out[c] = (uint8_t *)(a->scratch + (size_t)c * (size_t)f->nb_samples);
    planes[c] = a->scratch + (size_t)c * (size_t)f->nb_samples;
  }
  int got = swr_convert(a->swr, out, f->nb_samples, (const uint8_t **)f->extended_data, f->nb_samples);
  if (got != f->nb_samples)
    return fail(r, why, why_len, VIDEO_FORMAT, "libswresample failed on %s audio",
                av_get_sample_fmt_name(f->format) ? av_get_sample_fmt_name(f->format) : "?");
  return VIDEO_OK;
}

static int decode_audio(video_reader *r, audio_pass *a, double t0, double t1, video_audio *out, char *why,
                        size_t why_len) {
  char e[AV_ERROR_MAX_STRING_SIZE];
  int s = -1, ret = audio_open(r, a, &s, why, why_len);
  if (ret < 0) return ret;
  const char *name = a->dec->codec->name;
  int rate = a->dec->sample_rate, channels = a->dec->ch_layout.nb_channels;
  if (rate <= 0 || channels <= 0 || channels > 64)
    return fail(r, why, why_len, VIDEO_FORMAT, "the audio stream (%s) has %d Hz, %d channels", name, rate, channels);
  double span = (t1 - t0) * rate;
  if (!(span >= 0)) span = 0;
  double bytes = (span + 1) * channels * (double)sizeof(float);
  if (bytes > (double)r->limits.max_clip_bytes)
    return fail(r, why, why_len, VIDEO_TOO_BIG, "the clip's audio (%.0f samples x %d channels) is more than "
                "max_clip_bytes", span, channels);
  int64_t n = llround(span);
  *out = (video_audio){.channels = channels, .rate = rate, .frames = n};
  if (n > 0 && !(out->samples = calloc((size_t)n * (size_t)channels, sizeof(float))))
    return fail(r, why, why_len, VIDEO_NOMEM, "out of memory for the clip's audio");
  double tb = av_q2d(r->fmt->streams[s]->time_base), end = t0 + (double)n / rate, next = 0;
  bool draining = false;
  AVFrame *f = r->frame;
  for (;;) {
    av_frame_unref(f);
    ret = avcodec_receive_frame(a->dec, f);
    if (ret == 0) {
      int64_t ts = f->pts != AV_NOPTS_VALUE ? f->pts : f->best_effort_timestamp;
      double ft = ts != AV_NOPTS_VALUE ? (double)ts * tb : next;
      if (f->sample_rate != rate || f->ch_layout.nb_channels != channels)
        return fail(r, why, why_len, VIDEO_FORMAT, "the audio stream (%s) changes from %d Hz, %d channels to %d Hz, "
                    "%d channels midway", name, rate, channels, f->sample_rate, f->ch_layout.nb_channels);
      if (ft >= end) break; /* frames come in time order: the clip's span is complete */
      next = ft + (double)f->nb_samples / rate;
      int64_t first = llround((ft - t0) * rate), from = first < 0 ? -first : 0;
      int64_t to = first + f->nb_samples < n ? f->nb_samples : n - first;
      if (from >= to) continue;
      const float *planes[64];
      if ((ret = audio_planes(r, a, f, planes, why, why_len)) < 0) return ret;
      for (int c = 0; c < channels; c++)
        memcpy(out->samples + (size_t)c * (size_t)n + (size_t)(first + from), planes[c] + from,
               (size_t)(to - from) * sizeof(float));
      continue;
    }
    if (ret == AVERROR_EOF) break;
    if (ret != AVERROR(EAGAIN))
      return fail(r, why, why_len, VIDEO_FORMAT, "damaged audio stream (%s): %s", name, av_text(ret, e, sizeof e));
    if (draining) break;
    ret = av_read_frame(r->fmt, r->pkt);
    if (ret == AVERROR_EOF) {
      draining = true;
      avcodec_send_packet(a->dec, NULL);
      continue;
    }
    if (ret < 0) return fail(r, why, why_len, VIDEO_FORMAT, "damaged container: %s", av_text(ret, e, sizeof e));
    if (r->pkt->stream_index != s) {
      av_packet_unref(r->pkt);
      continue;
    }
    ret = avcodec_send_packet(a->dec, r->pkt);
    av_packet_unref(r->pkt);
    if (ret < 0 && ret != AVERROR(EAGAIN))
      return fail(r, why, why_len, VIDEO_FORMAT, "damaged audio stream (%s): %s", name, av_text(ret, e, sizeof e));
  }
  av_frame_unref(f);
  return VIDEO_OK;
}

int video_decode_audio(video_reader *r, double t0, double t1, video_audio *out, char *why, size_t why_len) {
  memset(out, 0, sizeof *out);
  r->last_error[0] = '\0';
  log_target = r->last_error;
  audio_pass a = {0};
  int ret = decode_audio(r, &a, t0, t1, out, why, why_len);
  audio_end(&a);
  log_target = NULL;
  if (ret < 0) {
    free(out->samples);
    memset(out, 0, sizeof *out);
  }
  return ret;
}

void video_close(video_reader **pr) {
  video_reader *r = *pr;
  if (!r) return;
  sws_freeContext(r->sws);
  avcodec_free_context(&r->dec);
  close_format(r);
  av_packet_free(&r->pkt);
  av_frame_free(&r->frame);
  free(r->pts);
  free(r->keys);
  free(r);
  *pr = NULL;
}
