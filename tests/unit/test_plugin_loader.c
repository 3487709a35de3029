/* The plugin loader and the registry: the example plugin's stage joins the registry once, however
 * often, by whatever spelling and from however many threads it is loaded; a missing name lists where it looked. */
#include <libgen.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plugin_loader.h"
#include "registry.h"

static const char *example_path(void) {
  const char *p = getenv("SF_EXAMPLE_PLUGIN"); /* tests/meson.build: plugins/example's example.so */
  assert_non_null(p);
  return p;
}

static int count_stages(void) {
  int n = 0;
  void *it = NULL;
  while (sf_stage_iterate(&it)) n++;
  return n;
}

static void *load_in_thread(void *arg) {
  const sf_plugin *p = NULL;
  sf_error e = {0};
  return sf_plugin_load(arg, &p, &e) == 0 ? (void *)p : NULL;
}

static void test_load_once(void **state) {
  int builtins = count_stages();
  assert_null(sf_stage_find("scale"));
  const sf_plugin *p = NULL;
  sf_error e = {0};
  assert_int_equal(sf_plugin_load(example_path(), &p, &e), 0);
  assert_string_equal(p->name, "example");
  const sf_stage_def *scale = sf_stage_find("scale");
  assert_non_null(scale);
  assert_ptr_equal(sf_registry_stage_plugin(scale), p);
  assert_null(sf_registry_stage_plugin(sf_stage_find("decode")));
  assert_int_equal(count_stages(), builtins + 1);
  void *it = NULL;
  const sf_stage_def *d, *last = NULL;
  while ((d = sf_stage_iterate(&it))) last = d;
  assert_ptr_equal(last, scale); /* plugins' stages come after the built-ins */

  /* Again: by another spelling of the path, by name through SHARDFLOW_PLUGIN_PATH, from four threads at once. */
  char dotted[4096], dir[4096];
  snprintf(dir, sizeof dir, "%s", example_path());
  snprintf(dotted, sizeof dotted, "%s/./example.so", dirname(dir));
  const sf_plugin *q = NULL;
  assert_int_equal(sf_plugin_load(dotted, &q, &e), 0);
  assert_ptr_equal(q, p);
  char env[4200];
  snprintf(env, sizeof env, "/nonexistent:%s", dir);
  setenv("SHARDFLOW_PLUGIN_PATH", env, 1);
  assert_int_equal(sf_plugin_load("example", &q, &e), 0);
  assert_ptr_equal(q, p);
  pthread_t t[4];
  for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, load_in_thread, dotted), 0);
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(t[i], &r);
    assert_ptr_equal(r, p);
  }
  assert_int_equal(count_stages(), builtins + 1);
}

static void test_not_found(void **state) {
  setenv("SHARDFLOW_PLUGIN_PATH", "/nonexistent/a::/nonexistent/b", 1);
  const sf_plugin *p = (const sf_plugin *)1;
  sf_error e = {0};
  assert_int_equal(sf_plugin_load("nosuch", &p, &e), SF_ENOENT);
  assert_null(p);
  assert_non_null(strstr(e.message, "/nonexistent/a/nosuch.so, /nonexistent/b/nosuch.so, "));
  assert_non_null(strstr(e.message, "SHARDFLOW_PLUGIN_PATH"));
  assert_int_equal(sf_plugin_load("", &p, &e), SF_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_load_once),
      cmocka_unit_test(test_not_found),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
