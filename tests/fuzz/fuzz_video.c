/* Fuzz target: the video plugin's member reader (plugins/video/clip.c) on fuzzer bytes as one member: the
 * in-memory AVIOContext, the demuxers it allows, the frame index, keyframe seeks, decoding and RGB conversion of
 * the first, middle and last frames, and the audio track's decode (libswresample) over the clip's span. */
#include <stdint.h>
#include <stdlib.h>

#include <libavutil/mem.h>

#include "clip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* The stage's default containers; a small clip bound keeps one input's memory in the fuzzer's limits. */
  const video_limits limits = {
      .threads = 1, .max_clip_bytes = 16 << 20, .containers = "mov,matroska,avi,mpegts,ogg,flv,ivf"};
  /* libavformat sizes some tables from counts a header declares (an MP4's sample tables: 1.8 GB asked for by
   * 2.7 KB of input) and fails cleanly when refused; refuse early so the fuzzer's memory limit tests the rest. */
  av_max_alloc(256 << 20);
  video_reader *r;
  char why[512];
  if (video_open(&r, data, size, &limits, why, sizeof why) != VIDEO_OK) return 0;
  const video_info *info = video_get_info(r);
  int64_t idx[3] = {0, info->frames / 2, info->frames - 1};
  size_t frame = (size_t)info->width * (size_t)info->height * 3;
  uint8_t *rgb = malloc(3 * frame);
  double pts[3];
  if (rgb) video_decode(r, idx, 3, rgb, pts, NULL, why, sizeof why);
  free(rgb);
  video_audio audio;
  double t1 = video_frame_time(r, idx[2]) + video_frame_duration(r, idx[2]);
  if (video_decode_audio(r, video_frame_time(r, 0), t1, &audio, why, sizeof why) == VIDEO_OK) free(audio.samples);
  video_close(&r);
  return 0;
}
