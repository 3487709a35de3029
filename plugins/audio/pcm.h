/* The audio plugin's libsndfile side, in a file of its own: libsndfile's sf_error and sf_strerror clash with shardflow's names. */
#ifndef AUDIO_PCM_H
#define AUDIO_PCM_H

#include <stddef.h>
#include <stdint.h>

/** Decoded audio: interleaved float32 frames (frame i, channel c at data[i * channels + c]). */
typedef struct audio_pcm {
  float *data;    /**< malloc'd, owned by the caller (free()) */
  int64_t frames; /**< frames per channel actually decoded */
  int channels;
  int rate;       /**< frames per second, as stored */
} audio_pcm;

/** Results of audio_pcm_read(). */
enum { AUDIO_PCM_OK = 0, AUDIO_PCM_FORMAT, AUDIO_PCM_TOO_BIG, AUDIO_PCM_NOMEM };

/**
 * Decodes a whole audio file held in memory (any format libsndfile reads:
 * WAV, FLAC, OGG/Vorbis...) through libsndfile's virtual I/O, with no
 * temporary file.  Integer PCM is scaled by 1/2^(bits-1), as
 * soundfile.read(dtype='float32') does.  A file claiming more than
 * max_samples frames x channels is refused before anything is allocated.
 * Returns AUDIO_PCM_OK with *pcm filled, or another AUDIO_PCM_* with why
 * (why_size bytes) saying what went wrong (libsndfile's own message for a
 * file it cannot read) and *pcm zeroed.
 */
int audio_pcm_read(const uint8_t *bytes, size_t size, int64_t max_samples, audio_pcm *pcm, char *why,
                   size_t why_size);

#endif
