/* Graph files: YAML reading, file:line errors with valid names, --set overrides, retired edges and replicas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "graph.h"

/* sf_graph_order_fingerprint of `ordered` (test_order_fingerprint), checked against Python hashlib.sha256 of the
 * hashed text written out by hand ("seed 2:11", "node 12:shard_source", ... one line a field; options only
 * where they differ from their defaults: shard_source's urls and batch's batch_size). */
#define PINNED_ORDER_FINGERPRINT "551cb2a2a20f357066a523de54ff36c4997ab9042e96f56758c07470e7430636"

static const char *const good =
    "seed: 7\n"
    "epochs: 3\n"
    "error_policy: fail\n"
    "stages:\n"
    "  - type: shard_source\n"
    "    urls: /data/s-{000..009}.tar\n"
    "  - type: tar_split\n"
    "  - type: decode\n"
    "    replicas: 2\n"
    "  - type: augment\n"
    "    replicas: 2\n"
    "    mean: [0.5, 0.5, 0.5]\n"
    "    std: [0.25, 0.25, 0.25]\n"
    "  - type: batch\n"
    "    batch_size: 16\n"
    "  - name: sink\n"
    "    type: device_sink\n";

static void test_load_good(void **state) {
  sf_graph *g;
  sf_error e;
  assert_int_equal(sf_graph_load_string(&g, good, "good.yaml", &e), 0);
  assert_int_equal(g->seed, 7);
  assert_int_equal(g->epochs, 3);
  assert_int_equal(g->error_policy, SF_POLICY_FAIL);
  assert_int_equal(sf_graph_node_count(g), 6);
  assert_string_equal(sf_graph_node_name(g, 5), "sink");
  assert_string_equal(sf_graph_node_type(g, 5), "device_sink");
  sf_graph_node *aug = sf_graph_find_node(g, "augment");
  assert_int_equal(aug->replicas, 2);
  assert_string_equal(aug->values[0].key, "mean");
  assert_string_equal(aug->values[0].value, "0.5, 0.5, 0.5");
  assert_int_equal(aug->values[0].line, 12);
  assert_int_equal(sf_graph_set(g, "batch.batch_size", "32", &e), 0);
  assert_string_equal(sf_graph_find_node(g, "batch")->values[0].value, "32");
  assert_int_equal(sf_graph_set(g, "seed", "9", &e), 0);
  assert_int_equal(g->seed, 9);
  assert_int_equal(sf_graph_set(g, "batch.batch_sise", "32", &e), SF_EOPTION);
  assert_non_null(strstr(e.message, "batch_size"));
  assert_int_equal(sf_graph_set(g, "nonode.x", "1", &e), SF_EOPTION);
  assert_non_null(strstr(e.message, "shard_source, tar_split"));
  /* a value is checked when set, so the caller can say where it came from (--set, a keyword argument) */
  assert_int_equal(sf_graph_set(g, "batch.batch_size", "0", &e), SF_EOPTION);
  assert_non_null(strstr(e.message, "batch_size"));
  assert_int_equal(sf_graph_validate(g, &e), 0);
  sf_graph *copy = sf_graph_copy(g);
  assert_int_equal(copy->n_nodes, 6);
  sf_graph_destroy(&copy);
  sf_graph_destroy(&g);
  assert_null(g);
}

/* The settings' defaults come from their table (the one help and the docs print): the values a graph without
 * settings has, written out here. An unknown setting's error names every setting. */
static void test_setting_defaults(void **state) {
  sf_graph *g;
  sf_error e;
  assert_int_equal(sf_graph_load_string(&g, "stages: [{type: shard_source, urls: a.tar}, {type: tar_split}, "
                                            "{type: batch, batch_size: 2}, {type: device_sink}]\n",
                                        "plain.yaml", &e),
                   0);
  assert_int_equal(g->seed, 0);
  assert_int_equal(g->epochs, 1);
  assert_int_equal(g->error_policy, SF_POLICY_SKIP);
  assert_int_equal(g->max_errors, 0);
  assert_true(g->max_error_rate == 0.5);
  assert_int_equal(g->queue_size, 64);
  assert_int_equal(g->queue_bytes, 64 * 1024 * 1024);
  assert_int_equal(g->threads, 0);
  assert_string_equal(g->metrics, "");
  assert_int_equal(sf_graph_set(g, "nosuch", "1", &e), SF_EOPTION);
  assert_non_null(strstr(e.message, "seed, epochs, error_policy, max_errors, max_error_rate, queue_size, queue_bytes, "
                                    "threads, metrics"));
  sf_graph_destroy(&g);
}

typedef struct bad_case {
  const char *text;
  int code;
  int64_t line;
  const char *needle;
} bad_case;

static void test_errors(void **state) {
  static const bad_case cases[] = {
      {"stages:\n  - type: shard_source\n    urls: x\n  - type: tar_splitt\n", SF_EGRAPH, 4, "tar_split, decode"},
      {"stages:\n  - type: shard_source\n    urls: x\n    shufle: true\n  - type: tar_split\n  - type: batch\n"
       "  - type: device_sink\n",
       SF_EOPTION, 4, "shuffle"},
      {"stages:\n  - type: shard_source\n    urls: x\n  - type: tar_split\n  - type: decode\n  - type: batch\n"
       "    batch_size: -4\n  - type: device_sink\n",
       SF_EOPTION, 7, "count"},
      {"seed: 1\nstages: [\n", SF_EGRAPH, 3, "YAML"},
      {"sead: 1\nstages: []\n", SF_EGRAPH, 1, "seed, epochs"},
      {"stages:\n  - urls: x\n", SF_EGRAPH, 2, "type"},
      {"stages:\n  - type: shard_source\n    urls: x\n  - type: batch\n  - type: device_sink\n", SF_EGRAPH, 4,
       "outputs shards"},
      {"stages:\n  - type: shard_source\n    urls: x\n  - type: tar_split\n    replicas: 2\n", SF_EGRAPH, 5,
       "replicas"},
      {"stages:\n  - type: shard_source\n    urls: x\n  - type: tar_split\n  - type: decode\n    replicas: 2\n"
       "  - type: augment\n    replicas: 3\n  - type: batch\n  - type: device_sink\n",
       SF_EGRAPH, 7, "equal replicas"},
      {"stages:\n  - type: shard_source\n    urls: x\n  - type: tar_split\n  - type: decode\n  - type: batch\n"
       "  - type: device_sink\nedges:\n  - shard_source -> tar_split\n  - tar_split -> nowhere\n",
       SF_EGRAPH, 10, "unknown node"},
      {"error_policy: maybe\nstages: []\n", SF_EOPTION, 1, "skip|fail"},
      {"stages:\n  - type: shard_source\n    urls:\n      nested: 1\n", SF_EGRAPH, 4, "nested"},
      /* A key written twice would otherwise let the last one win without a word. */
      {"seed: 0\nseed: 1\nstages:\n  - type: shard_source\n    urls: x\n  - type: tar_split\n  - type: batch\n"
       "  - type: device_sink\n",
       SF_EGRAPH, 2, "'seed' appears twice (lines 1 and 2)"},
      {"stages:\n  - type: shard_source\n    urls: x\n  - type: tar_split\n  - type: batch\n    batch_size: 2\n"
       "    batch_size: 3\n  - type: device_sink\n",
       SF_EGRAPH, 7, "'batch_size' appears twice"},
      {"groups:\n  g: {processes: 1, processes: 2}\nstages:\n  - type: shard_source\n    urls: x\n",
       SF_EGRAPH, 2, "'processes' appears twice"},
      /* Only the first document was read: a second one (say, a pasted graph) was ignored. */
      {"stages:\n  - type: shard_source\n    urls: x\n---\nseed: 3\n", SF_EGRAPH, 4, "second YAML document"},
      {"seed: 1\nstages: []\n", SF_EGRAPH, 2, "`stages` is empty"},
      {"sead: 1\nstages: []\n", SF_EGRAPH, 1, "stages, groups"},
  };
  int failed = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sf_graph *g = NULL;
    sf_error e;
    memset(&e, 0, sizeof e);
    int r = sf_graph_load_string(&g, cases[i].text, "bad.yaml", &e);
    if (r != cases[i].code || e.line != cases[i].line || !strstr(e.message, cases[i].needle) ||
        strcmp(e.url, "bad.yaml") != 0) {
      print_error("case %zu: got %s line %lld '%s'; want %s line %lld '%s'\n", i, sf_err_name(r),
                  (long long)e.line, e.message, sf_err_name(cases[i].code), (long long)cases[i].line,
                  cases[i].needle);
      failed++;
    }
    sf_graph_destroy(&g);
  }
  if (failed) fail_msg("%d of %zu cases failed", failed, sizeof cases / sizeof cases[0]);
}

/* 100,000 nested flow lists took libyaml 34 s (quadratic): refused at a small depth, at once. */
static void test_deep_nesting(void **state) {
  enum { DEPTH = 100000 };
  static const char *const shapes[][2] = {{"[", "]"}, {"{a: ", "}"}, {"- ", ""}};
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
    size_t open = strlen(shapes[k][0]), close = strlen(shapes[k][1]);
    char *text = malloc(16 + DEPTH * (open + close) + 8);
    assert_non_null(text);
    char *t = text + sprintf(text, "seed: 1\nstages:\n  ");
    for (int i = 0; i < DEPTH; i++) t = memcpy(t, shapes[k][0], open), t += open;
    t += sprintf(t, "x");
    for (int i = 0; i < DEPTH; i++) t = memcpy(t, shapes[k][1], close), t += close;
    strcpy(t, "\n");
    sf_graph *g = NULL;
    sf_error e;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int r = sf_graph_load_string(&g, text, "deep.yaml", &e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    free(text);
    if (r != SF_EGRAPH || e.line != 3 || !strstr(e.message, "nested deeper than"))
      fail_msg("shape %zu: got %s line %lld '%s'", k, sf_err_name(r), (long long)e.line, e.message);
    if (seconds > 1.0) fail_msg("shape %zu: refusing took %.2f s", k, seconds);
    assert_null(g);
  }
}

/*
 * `edges:` said nothing `inputs:` and file order cannot (a chain in another order than the file's): it is
 * retired, and a graph that still has it is refused with what to write instead, the chain its edges make.
 */
static void test_edges_retired(void **state) {
  const char *text =
      "stages:\n"
      "  - type: device_sink\n"
      "  - type: batch\n"
      "  - type: shard_source\n"
      "    urls: x\n"
      "  - type: tar_split\n"
      "edges:\n"
      "  - shard_source -> tar_split\n"
      "  - [tar_split, batch]\n"
      "  - batch -> device_sink\n";
  sf_graph *g = NULL;
  sf_error e;
  assert_int_equal(sf_graph_load_string(&g, text, "edges.yaml", &e), SF_EGRAPH);
  assert_null(g);
  assert_int_equal(e.line, 7);
  if (!strstr(e.message, "`edges:` is retired") || !strstr(e.message, "shard_source, tar_split, batch, device_sink") ||
      !strstr(e.message, "inputs:"))
    fail_msg("the refusal says what to write instead: '%s'", e.message);
}

/* A port list with a template row (request ports): names and kinds per port, its capacity; fixed rows first. */
static void test_port_template(void **state) {
  static const sf_port_def fixed[] = {{"in", SF_PORT_SAMPLE}, {NULL, SF_PORT_NONE}};
  static const sf_port_def mixed[] = {{"main", SF_PORT_SHARD}, {"aux_%u_x", SF_PORT_SAMPLE}, {NULL, SF_PORT_NONE}};
  static const sf_port_def odd[] = {{"a%s%u%n", SF_PORT_SAMPLE}, {NULL, SF_PORT_NONE}};
  char name[32];
  assert_int_equal(sf_port_capacity(fixed), 1);
  assert_int_equal(sf_port_capacity(NULL), 0);
  assert_int_equal(sf_port_capacity(mixed), SF_NODE_INPUTS_MAX);
  assert_int_equal(sf_port_kind_at(fixed, 0), SF_PORT_SAMPLE);
  assert_int_equal(sf_port_kind_at(fixed, 1), SF_PORT_NONE);
  assert_int_equal(sf_port_name_at(fixed, 1, name, sizeof name), -1);
  assert_int_equal(sf_port_kind_at(mixed, 0), SF_PORT_SHARD);
  assert_int_equal(sf_port_kind_at(mixed, 5), SF_PORT_SAMPLE);
  assert_int_equal(sf_port_kind_at(mixed, SF_NODE_INPUTS_MAX), SF_PORT_NONE);
  sf_port_name_at(mixed, 0, name, sizeof name);
  assert_string_equal(name, "main");
  sf_port_name_at(mixed, 12, name, sizeof name);
  assert_string_equal(name, "aux_11_x");
  /* the stage's name is text, never a format: only "%u" is replaced */
  sf_port_name_at(odd, 3, name, sizeof name);
  assert_string_equal(name, "a%s3%n");
}

static void test_missing_file(void **state) {
  sf_graph *g;
  sf_error e;
  assert_int_equal(sf_graph_load_file(&g, "/nonexistent/graph.yaml", &e), SF_ENOENT);
  assert_string_equal(e.url, "/nonexistent/graph.yaml");
}


/* The order fingerprint: the same for what rebuilds the same batches, another for anything that changes them. */
static const char *const ordered =
    "seed: 11\n"
    "stages:\n"
    "  - type: shard_source\n"
    "    urls: /data/s-{000..009}.tar\n"
    "  - type: tar_split\n"
    "  - type: decode\n"
    "  - type: augment\n"
    "    crop: random\n"
    "    size: 8\n"
    "  - type: shuffle\n"
    "    buffer_size: 10000\n"
    "  - type: batch\n"
    "    batch_size: 16\n"
    "  - type: device_sink\n";

/* The fingerprint of `ordered` with one change (--set TARGET=VALUE), or of `text` when target is NULL. */
static void fingerprint_of(const char *text, const char *target, const char *value,
                           char out[SF_ORDER_FINGERPRINT_SIZE]) {
  sf_graph *g;
  sf_error e;
  assert_int_equal(sf_graph_load_string(&g, text, "ordered.yaml", &e), 0);
  if (target) assert_int_equal(sf_graph_set(g, target, value, &e), 0);
  assert_int_equal(sf_graph_order_fingerprint(g, out, SF_ORDER_FINGERPRINT_SIZE, &e), 0);
  sf_graph_destroy(&g);
}

static void test_order_fingerprint(void **state) {
  (void)state;
  char base[SF_ORDER_FINGERPRINT_SIZE], other[SF_ORDER_FINGERPRINT_SIZE];
  fingerprint_of(ordered, NULL, NULL, base);
  assert_int_equal(strlen(base), 64);
  assert_int_equal(strspn(base, "0123456789abcdef"), 64);
  /* Pinned: states saved by earlier builds must keep loading. Change it only together with the version tag
   * in engine/graph/graph_fingerprint.c, when what counts changes on purpose. */
  assert_string_equal(base, PINNED_ORDER_FINGERPRINT);
  /* What never changes the batches: placement, speed, where data is kept, a sample's bytes, and how the
   * file spells a value. */
  static const char *const same[][2] = {
      {"decode.replicas", "3"},       {"augment.replicas", "2"},      {"threads", "3"},
      {"queue_size", "8"},            {"epochs", "5"},                {"error_policy", "fail"},
      {"tar_split.prefetch", "8"},    {"tar_split.mmap", "false"},    {"tar_split.cache_dir", "/tmp/c"},
      {"augment.flip", "0.5"},        {"augment.dtype", "uint8"},     {"device_sink.npy_dir", "/tmp/x"},
      {"decode.mode", "gray"},        {"batch.pin_memory", "true"},   {"shard_source.plan", "/tmp/plan.txt"},
      {"shuffle.buffer_size", "10k"}, {"shuffle.buffer_size", "10_000"},
      /* options added later (at their defaults, or I/O only), and a default written out */
      {"tar_split.dead_host_shards", "0"}, {"batch.partial", "true"},   {"shuffle.buffer_size", "10000"},
  };
  for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
    fingerprint_of(ordered, same[i][0], same[i][1], other);
    if (strcmp(base, other) != 0) fail_msg("%s=%s changed the order fingerprint", same[i][0], same[i][1]);
  }
  /* The same graph laid out otherwise (key order, comments, YAML list syntax), and split into groups. */
  fingerprint_of("# the same graph\n"
                 "stages:\n"
                 "  - {type: shard_source, urls: '/data/s-{000..009}.tar'}\n"
                 "  - type: tar_split\n"
                 "  - {type: decode, group: d}\n"
                 "  - {type: augment, size: 8, crop: random, group: d}\n"
                 "  - {type: shuffle, buffer_size: 10000}\n"
                 "  - {type: batch, batch_size: 16}\n"
                 "  - type: device_sink\n"
                 "groups:\n"
                 "  d:\n"
                 "    processes: 2\n"
                 "seed: 11\n",
                 NULL, NULL, other);
  assert_string_equal(base, other);
  /* What changes which samples an epoch holds, their order, or where batches are cut. */
  static const char *const changed[][2] = {
      {"seed", "12"},
      {"shard_source.urls", "/data/s-{000..008}.tar"},
      {"shard_source.shuffle", "false"},
      {"shard_source.samples_per_epoch", "100"},
      {"shard_source.workers", "2"},
      {"shard_source.sampling", "resample"},
      {"tar_split.key_rule", "last_dot"},
      {"tar_split.max_sample_size", "1MiB"},
      {"decode.max_pixels", "1000"},
      {"shuffle.buffer_size", "100"},
      {"shuffle.initial", "10"},
      {"batch.batch_size", "32"},
      {"batch.partial", "false"},
      {"batch.bucket_hold", "10"},
  };
  for (size_t i = 0; i < sizeof changed / sizeof *changed; i++) {
    fingerprint_of(ordered, changed[i][0], changed[i][1], other);
    if (strcmp(base, other) == 0) fail_msg("%s=%s kept the order fingerprint", changed[i][0], changed[i][1]);
  }
  /* A node's name seeds its random stream; a stage more or less is another graph. */
  char renamed[1024];
  const char *at = strstr(ordered, "  - type: shuffle\n");
  snprintf(renamed, sizeof renamed, "%.*s  - name: mixer\n    type: shuffle\n%s", (int)(at - ordered), ordered,
           at + strlen("  - type: shuffle\n"));
  fingerprint_of(renamed, NULL, NULL, other);
  assert_string_not_equal(base, other);
  char fewer[1024];
  at = strstr(ordered, "  - type: decode\n");
  snprintf(fewer, sizeof fewer, "%.*s%s", (int)(at - ordered), ordered, at + strlen("  - type: decode\n"));
  fingerprint_of(fewer, NULL, NULL, other);
  assert_string_not_equal(base, other);
  /* The buffer, the arguments, a graph that does not validate. */
  sf_graph *g;
  sf_error e;
  assert_int_equal(sf_graph_load_string(&g, ordered, "ordered.yaml", &e), 0);
  char small[64] = "x";
  assert_int_equal(sf_graph_order_fingerprint(g, small, sizeof small, &e), SF_EINVAL);
  assert_string_equal(small, "");
  assert_int_equal(sf_graph_order_fingerprint(NULL, base, sizeof base, NULL), SF_EINVAL);
  sf_graph_destroy(&g);
  /* A value out of range (set in the model: loading and sf_graph_set refuse it at once). */
  assert_int_equal(sf_graph_load_string(&g, ordered, "ordered.yaml", &e), 0);
  sf_graph_node *batch = sf_graph_find_node(g, "batch");
  assert_string_equal(batch->values[0].key, "batch_size");
  free(batch->values[0].value);
  assert_non_null(batch->values[0].value = strdup("0"));
  assert_int_equal(sf_graph_order_fingerprint(g, base, sizeof base, &e), SF_EOPTION);
  assert_non_null(strstr(e.message, "batch_size"));
  sf_graph_destroy(&g);
}

/* sf_graph_attach: an object for a named node, carried by copies, and no option of that name for a graph file. */
static void test_attach(void **state) {
  (void)state;
  sf_graph *g = NULL;
  sf_error e = {0};
  assert_int_equal(sf_graph_load_string(&g, good, "good.yaml", &e), 0);
  int object = 7;
  assert_int_equal(sf_graph_attach(g, "no_such_node", &object), SF_ENOENT);
  assert_int_equal(sf_graph_attach(g, "decode", &object), 0);
  sf_graph *copy = sf_graph_copy(g);
  assert_non_null(copy);
  assert_ptr_equal(sf_graph_find_node(copy, "decode")->attachment, &object);
  assert_null(sf_graph_find_node(copy, "batch")->attachment);
  assert_int_equal(sf_graph_attach(g, "decode", NULL), 0);
  assert_null(sf_graph_find_node(g, "decode")->attachment);
  sf_graph_destroy(&copy);
  sf_graph_destroy(&g);
  /* the python stage's handoff is no option: a graph file cannot name one */
  int r = sf_graph_load_string(&g, "stages: [{type: shard_source, urls: a.tar}, {type: tar_split}, "
                                   "{type: python, function: \"m:f\", handoff: h}, {type: batch}, {type: device_sink}]",
                               "attach.yaml", &e);
  if (r == 0) r = sf_graph_validate(g, &e);
  assert_int_equal(r, SF_EOPTION);
  assert_non_null(strstr(e.message, "handoff"));
  sf_graph_destroy(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_load_good),
      cmocka_unit_test(test_setting_defaults),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_deep_nesting),
      cmocka_unit_test(test_edges_retired),
      cmocka_unit_test(test_port_template),
      cmocka_unit_test(test_missing_file),
      cmocka_unit_test(test_order_fingerprint),
      cmocka_unit_test(test_attach),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
