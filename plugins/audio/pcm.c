/* The audio plugin's libsndfile side: decodes a file held in memory through SF_VIRTUAL_IO. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sndfile.h>

#include "pcm.h"

/* libsndfile's virtual I/O over one field's bytes. */
typedef struct memfile {
  const uint8_t *data;
  sf_count_t size, pos;
} memfile;

static sf_count_t mem_length(void *opaque) { return ((memfile *)opaque)->size; }

static sf_count_t mem_seek(sf_count_t offset, int whence, void *opaque) {
  memfile *m = opaque;
  sf_count_t base = whence == SEEK_CUR ? m->pos : whence == SEEK_END ? m->size : 0;
  if (offset < -base || offset > m->size - base) return -1;
  return m->pos = base + offset;
}

static sf_count_t mem_read(void *dst, sf_count_t n, void *opaque) {
  memfile *m = opaque;
  if (n < 0) return 0;
  if (n > m->size - m->pos) n = m->size - m->pos;
  memcpy(dst, m->data + m->pos, (size_t)n);
  m->pos += n;
  return n;
}

static sf_count_t mem_write(const void *src, sf_count_t n, void *opaque) {
  (void)src, (void)n, (void)opaque;
  return 0;
}

static sf_count_t mem_tell(void *opaque) { return ((memfile *)opaque)->pos; }

int audio_pcm_read(const uint8_t *bytes, size_t size, int64_t max_samples, audio_pcm *pcm, char *why,
                   size_t why_size) {
  memset(pcm, 0, sizeof *pcm);
  SF_VIRTUAL_IO io = {mem_length, mem_seek, mem_read, mem_write, mem_tell};
  memfile m = {bytes, (sf_count_t)size, 0};
  SF_INFO info;
  memset(&info, 0, sizeof info);
  SNDFILE *snd = sf_open_virtual(&io, SFM_READ, &info, &m);
  if (!snd) {
    snprintf(why, why_size, "libsndfile cannot read it: %s", sf_strerror(NULL));
    return AUDIO_PCM_FORMAT;
  }
  int r = AUDIO_PCM_OK;
  if (info.channels < 1 || info.frames < 0 || info.samplerate < 1 ||
      (double)info.frames * info.channels > (double)max_samples) {
    snprintf(why, why_size, "%lld frames x %d channels at %d Hz is empty or more than max_samples",
             (long long)info.frames, info.channels, info.samplerate);
    r = AUDIO_PCM_TOO_BIG;
  } else if (!(pcm->data = malloc(((size_t)info.frames * (size_t)info.channels + 1) * sizeof(float)))) {
    snprintf(why, why_size, "cannot allocate %lld frames", (long long)info.frames);
    r = AUDIO_PCM_NOMEM;
  } else {
    pcm->frames = sf_readf_float(snd, pcm->data, info.frames);
    pcm->channels = info.channels;
    pcm->rate = info.samplerate;
    if (sf_error(snd) != SF_ERR_NO_ERROR) {
      snprintf(why, why_size, "libsndfile: %s", sf_strerror(snd));
      r = AUDIO_PCM_FORMAT;
    }
  }
  sf_close(snd);
  if (r != AUDIO_PCM_OK) {
    free(pcm->data);
    memset(pcm, 0, sizeof *pcm);
  }
  return r;
}
