/* Runs one shard through tar_split and the audio plugin's audio_decode under the harness; writes each field as .npy. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "npy.h"
#include "shardflow/plugin.h"

const sf_plugin *sf_plugin_entry(void); /* plugins/audio/audio.c, built in */

/*
 * Usage: audio_harness SHARD OUTDIR [option=value...]
 * Writes OUTDIR/KEY.FIELD.npy for every decoded field of every sample that
 * comes out, then prints "samples N errors N skipped N" and each error record
 * (one per line) to stdout.  The stage definition comes from the plugin's
 * entry point, as the loader will take it.
 */
int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s SHARD OUTDIR [option=value...]\n", argv[0]);
    return 2;
  }
  const sf_plugin *plugin = sf_plugin_entry();
  if (plugin->abi_version != SF_STAGE_ABI_VERSION || !plugin->stages[0] ||
      strcmp(plugin->stages[0]->name, "audio_decode") != 0) {
    fprintf(stderr, "audio plugin descriptor is not what the test expects\n");
    return 1;
  }
  sf_error error = {0};
  sf_harness *split = NULL, *audio = NULL;
  if (sf_harness_new(&split, "tar_split", NULL, 1, 0, 0, 1, &error) < 0 ||
      sf_harness_new_def(&audio, plugin->stages[0], (const char *const *)argv + 3, 7, 0, 0, 1, &error) < 0) {
    printf("setup: %s\n", error.message);
    sf_harness_destroy(&split);
    return 1;
  }
  sf_item item = {.kind = SF_ITEM_SHARD, .u.shard = sf_shard_new(argv[1])};
  sf_harness_push(split, &item);
  sf_harness_close_input(split);
  int r;
  while ((r = sf_harness_run(split, 0)) == SF_EAGAIN) usleep(1000);
  while (sf_harness_pop(split, &item) == 0) sf_harness_push(audio, &item);
  sf_harness_close_input(audio);
  r = sf_harness_run(audio, 0);
  int samples = 0, status = r == SF_EOF ? 0 : 1;
  while (sf_harness_pop(audio, &item) == 0) {
    if (item.kind != SF_ITEM_SAMPLE) {
      sf_item_clear(&item);
      continue;
    }
    samples++;
    sf_sample *s = item.u.sample;
    for (int i = 0; i < s->n_fields; i++) {
      if (s->fields[i].encoded) continue;
      char path[4096];
      snprintf(path, sizeof path, "%s/%s.%s.npy", argv[2], s->key, s->fields[i].name);
      if (sf_npy_write(path, &s->fields[i].tensor, &error) < 0) {
        printf("npy: %s\n", error.message);
        status = 1;
      }
    }
    sf_item_clear(&item);
  }
  printf("samples %d errors %llu skipped %llu\n", samples, (unsigned long long)sf_harness_error_count(audio),
         (unsigned long long)sf_harness_skipped(audio));
  if (sf_harness_error_count(audio)) {
    char text[1024];
    printf("%s\n", sf_error_format(sf_harness_last_error(audio), text, sizeof text));
  }
  if (r != SF_EOF) printf("audio_decode step: %s\n", sf_strerror(r));
  sf_harness_destroy(&split);
  sf_harness_destroy(&audio);
  return status;
}
