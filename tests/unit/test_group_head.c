/*
 * The group's head stage (engine/group/head.c) with local worker processes, several pipelines in one process:
 * a trainer with a train and a validation pipeline whose graphs both have a group `decoders`. Each head
 * must get its own local socket (before, both bound $TMPDIR/shardflow-PID-decoders.ipc, the workers all
 * joined the second head and the first waited for ever), and a closed pipeline leaves nothing in $TMPDIR.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "shardflow/shardflow.h"

enum { PIPELINES = 3 };

/* Writes a ustar shard of n samples, keys PREFIX0000.., each with one `cls` member holding its index. */
static void write_shard(const char *path, const char *prefix, int n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  for (int i = 0; i < n; i++) {
    char h[512] = {0}, body[512] = {0};
    int len = snprintf(body, sizeof body, "%d", i);
    snprintf(h, 100, "%s%04d.cls", prefix, i);
    memcpy(h + 100, "0000644", 7);
    memcpy(h + 108, "0000000", 7);
    memcpy(h + 116, "0000000", 7);
    snprintf(h + 124, 12, "%011o", len);
    memcpy(h + 136, "00000000000", 11);
    h[156] = '0';
    memcpy(h + 257, "ustar\0" "00", 8);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int k = 0; k < 512; k++) sum += (unsigned char)h[k];
    snprintf(h + 148, 8, "%06o", sum);
    assert_int_equal(fwrite(h, 1, 512, f), 512);
    assert_int_equal(fwrite(body, 1, 512, f), 512);
  }
  char end[1024] = {0};
  assert_int_equal(fwrite(end, 1, sizeof end, f), sizeof end);
  assert_int_equal(fclose(f), 0);
}

/* Entries of dir whose name starts with "shardflow-" (what heads leave in $TMPDIR). */
static int leftovers(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, "shardflow-", 10) == 0;
  closedir(d);
  return n;
}

static void test_same_group_name_in_two_pipelines(void **state) {
  (void)state;
  const char *cli = getenv("SHARDFLOW");
  if (!cli) skip(); /* run by meson, which names the CLI the heads start as their workers */
  setenv("SHARDFLOW_BIN", cli, 1);
  char dir[] = "/tmp/sf-test-remote-XXXXXX";
  assert_non_null(mkdtemp(dir));
  setenv("TMPDIR", dir, 1); /* where the heads put their sockets: checked empty at the end */
  sf_pipeline *p[PIPELINES] = {0};
  int want[PIPELINES], got[PIPELINES] = {0};
  bool ended[PIPELINES] = {0};
  for (int i = 0; i < PIPELINES; i++) {
    char shard[128], prefix[8], text[1024];
    snprintf(shard, sizeof shard, "%s/p%d.tar", dir, i);
    snprintf(prefix, sizeof prefix, "p%d-", i);
    want[i] = 10 + 7 * i;
    write_shard(shard, prefix, want[i]);
    snprintf(text, sizeof text,
             "seed: 1\n"
             "groups:\n"
             "  decoders: {processes: 1, unit_samples: 4}\n"
             "stages:\n"
             "  - type: shard_source\n"
             "    urls: %s\n"
             "  - type: tar_split\n"
             "  - type: decode\n"
             "    group: decoders\n"
             "  - type: batch\n"
             "    batch_size: 4\n"
             "    partial: true\n"
             "  - type: device_sink\n",
             shard);
    sf_graph *g;
    sf_error e;
    if (sf_graph_load_string(&g, text, "remote.yaml", &e) < 0) fail_msg("graph: %s", e.message);
    int r = sf_pipeline_new(&p[i], g, NULL, &e);
    sf_graph_destroy(&g);
    if (r < 0) fail_msg("pipeline %d: %s", i, e.message);
  }
  /* Round robin, the way a trainer alternates train and validation steps; a head without workers times out. */
  for (int left = PIPELINES; left > 0;) {
    for (int i = 0; i < PIPELINES; i++) {
      if (ended[i]) continue;
      sf_batch *b = NULL;
      int r = sf_pipeline_next(p[i], &b, 20.0);
      if (r == SF_EOF) {
        ended[i] = true;
        left--;
        continue;
      }
      if (r < 0) fail_msg("pipeline %d after %d of %d samples: %s", i, got[i], want[i], sf_strerror(r));
      char prefix[8];
      snprintf(prefix, sizeof prefix, "p%d-", i);
      for (int64_t j = 0; j < sf_batch_size(b); j++) {
        assert_non_null(strstr(sf_batch_key(b, j), prefix)); /* its own shard's samples only */
        got[i]++;
      }
      sf_batch_destroy(&b);
    }
  }
  for (int i = 0; i < PIPELINES; i++) assert_int_equal(got[i], want[i]);
  assert_int_not_equal(leftovers(dir), 0); /* the heads' sockets, while they run */
  for (int i = 0; i < PIPELINES; i++) sf_pipeline_destroy(&p[i]);
  assert_int_equal(leftovers(dir), 0);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  alarm(120); /* a head that waits for ever fails the test instead of hanging the suite */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_group_name_in_two_pipelines),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
