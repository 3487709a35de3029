/* Test helper: dlopen()s a plugin, runs one of its stages under the one-stage harness on a shard's samples,
 * and prints the int32/int64 fields of every output sample as JSON lines (until the plugin loader lands).
 *
 * Usage: plugin_stage_run PLUGIN.so STAGE SHARD.tar [option=value...]
 * Prints {"key": K, "fields": {NAME: [values...]}} per sample, then
 * {"errors": N, "skipped": N, "last_error": {...}|null}. Exit 0, or 2 when the plugin or init fails
 * (the message on stderr). */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "shardflow/plugin.h"

static void print_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') printf("\\%c", c);
    else if (c < 0x20) printf("\\u%04x", c);
    else putchar(c);
  }
  putchar('"');
}

static void print_sample(const sf_sample *s) {
  printf("{\"key\": ");
  print_string(s->key);
  printf(", \"fields\": {");
  const char *sep = "";
  for (int i = 0; i < s->n_fields; i++) {
    const sf_tensor *t = &s->fields[i].tensor;
    if (t->dtype != SF_DTYPE_INT32 && t->dtype != SF_DTYPE_INT64) continue;
    printf("%s\"%s\": {\"dtype\": \"%s\", \"shape\": [", sep, s->fields[i].name, sf_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++) printf("%s%" PRId64, d ? ", " : "", t->shape[d]);
    printf("], \"values\": [");
    const void *data = sf_tensor_data(t);
    for (int64_t j = 0; j < sf_tensor_numel(t); j++) {
      int64_t v = t->dtype == SF_DTYPE_INT32 ? ((const int32_t *)data)[j] : ((const int64_t *)data)[j];
      printf("%s%" PRId64, j ? ", " : "", v);
    }
    printf("]}");
    sep = ", ";
  }
  printf("}}\n");
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s PLUGIN.so STAGE SHARD.tar [option=value...]\n", argv[0]);
    return 2;
  }
  void *so = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 2;
  }
  sf_plugin_entry_fn entry = (sf_plugin_entry_fn)dlsym(so, SF_PLUGIN_ENTRY);
  const sf_plugin *plugin = entry ? entry() : NULL;
  if (!plugin || plugin->abi_version != SF_STAGE_ABI_VERSION) {
    fprintf(stderr, "%s: no %s entry point, or ABI version other than %d\n", argv[1], SF_PLUGIN_ENTRY,
            SF_STAGE_ABI_VERSION);
    return 2;
  }
  const sf_stage_def *def = NULL;
  for (const sf_stage_def *const *d = plugin->stages; *d; d++)
    if (strcmp((*d)->name, argv[2]) == 0) def = *d;
  if (!def) {
    fprintf(stderr, "%s: plugin %s has no stage %s\n", argv[1], plugin->name, argv[2]);
    return 2;
  }

  /* tar_split reads the shard into samples; the plugin's stage takes them one by one. */
  sf_error e = {0};
  sf_harness *split = NULL, *h = NULL;
  if (sf_harness_new(&split, "tar_split", NULL, 1, 0, 0, 1, &e) < 0 ||
      sf_harness_new_def(&h, def, (const char *const *)argv + 4, 1, 0, 0, 1, &e) < 0) {
    fprintf(stderr, "%s (%s)\n", e.message, sf_strerror(e.code));
    sf_harness_destroy(&split);
    return 2;
  }
  sf_item item = {.kind = SF_ITEM_SHARD, .u.shard = sf_shard_new(argv[3])};
  sf_harness_push(split, &item);
  sf_harness_close_input(split);
  int r = sf_harness_run(split, 0);
  while (sf_harness_pop(split, &item) == 0) sf_harness_push(h, &item);
  sf_harness_close_input(h);
  int rs = sf_harness_run(h, 0);
  while (sf_harness_pop(h, &item) == 0) {
    if (item.kind == SF_ITEM_SAMPLE) print_sample(item.u.sample);
    sf_item_clear(&item);
  }
  const sf_error *last = sf_harness_last_error(h);
  printf("{\"errors\": %" PRIu64 ", \"skipped\": %" PRIu64 ", \"split_errors\": %" PRIu64 ", \"last_error\": ",
         sf_harness_error_count(h), sf_harness_skipped(h), sf_harness_error_count(split));
  if (last) {
    printf("{\"code\": \"%s\", \"url\": ", sf_err_name(last->code));
    print_string(last->url);
    printf(", \"key\": ");
    print_string(last->key);
    printf(", \"message\": ");
    print_string(last->message);
    printf("}}\n");
  } else {
    printf("null}\n");
  }
  sf_harness_destroy(&h);
  sf_harness_destroy(&split);
  return r == SF_EOF && rs == SF_EOF ? 0 : 1;
}
