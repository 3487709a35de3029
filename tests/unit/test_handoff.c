/* The handoff: order with markers, pass/drop/error results, names, close with a sample held, a thread serving it. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "shardflow/handoff.h"

static sf_item sample_item(const char *key, uint8_t value) {
  sf_sample *s = sf_sample_new();
  sf_sample_set_key(s, key, strlen(key));
  int64_t shape[1] = {3};
  uint8_t data[3] = {value, value, value};
  assert_int_equal(sf_sample_add_field_copy(s, "bin", true, SF_DTYPE_UINT8, 1, shape, data), 0);
  return (sf_item){.kind = SF_ITEM_SAMPLE, .u.sample = s};
}

static void put(sf_handoff *h, sf_item it) { assert_int_equal(sf_handoff_put(h, &it), 0); }

static void test_results_in_order(void **state) {
  (void)state;
  sf_handoff *h;
  assert_int_equal(sf_handoff_new(&h, 4), 0);
  sf_handoff *second = sf_handoff_ref(h);
  assert_ptr_equal(second, h);
  sf_handoff_unref(&second); /* one reference left: h stays usable */
  assert_null(second);
  put(h, sample_item("a", 1));
  put(h, (sf_item){.kind = SF_ITEM_EPOCH_END, .epoch = 0});
  put(h, sample_item("b", 2));
  put(h, sample_item("c", 3));
  assert_false(sf_handoff_can_put(h));
  sf_item it = sample_item("d", 4);
  assert_int_equal(sf_handoff_put(h, &it), SF_EAGAIN); /* full: untouched */
  sf_item_clear(&it);

  int status;
  char msg[64];
  assert_int_equal(sf_handoff_get(h, &it, &status, msg, sizeof msg), SF_EAGAIN); /* a not done yet */

  sf_sample *s;
  assert_int_equal(sf_handoff_take(h, &s, 0), 0); /* a: replaced by a float32 field and a shared one */
  assert_string_equal(sf_sample_key(s), "a");
  sf_sample *out = sf_sample_derive(s);
  float f[2] = {1.5f, -2};
  int64_t shape[1] = {2};
  assert_int_equal(sf_sample_add_field_copy(out, "x", false, SF_DTYPE_FLOAT32, 1, shape, f), 0);
  assert_int_equal(sf_sample_add_field_ref(out, "y", s, 0), 0);
  assert_int_equal(sf_sample_add_field_ref(out, "y", s, 0), SF_EDUP);
  sf_handoff_finish(h, &out, SF_HANDOFF_PASS, NULL);
  assert_null(out);
  assert_int_equal(sf_handoff_take(h, &s, 0), 0); /* the marker is stepped over: b */
  assert_string_equal(sf_sample_key(s), "b");
  sf_handoff_finish(h, NULL, SF_HANDOFF_DROP, NULL);
  assert_int_equal(sf_handoff_take(h, &s, 0), 0);
  sf_handoff_finish(h, NULL, SF_EINVAL, "python map f raised ValueError: c");
  assert_int_equal(sf_handoff_take(h, &s, 0.01), SF_ETIMEDOUT);

  assert_int_equal(sf_handoff_get(h, &it, &status, msg, sizeof msg), 0);
  assert_int_equal(status, SF_HANDOFF_PASS);
  assert_string_equal(it.u.sample->key, "a");
  assert_int_equal(sf_sample_field_count(it.u.sample), 2);
  const sf_field *x = sf_sample_field_at(it.u.sample, 0), *y = sf_sample_field_at(it.u.sample, 1);
  assert_string_equal(x->name, "x");
  assert_true(((float *)sf_tensor_data(&x->tensor))[0] == 1.5f);
  assert_true(y->encoded && ((uint8_t *)sf_tensor_data(&y->tensor))[2] == 1);
  sf_item_clear(&it);
  assert_int_equal(sf_handoff_get(h, &it, &status, msg, sizeof msg), 0);
  assert_int_equal(it.kind, SF_ITEM_EPOCH_END);
  assert_int_equal(sf_handoff_get(h, &it, &status, msg, sizeof msg), 0);
  assert_int_equal(status, SF_HANDOFF_DROP);
  assert_string_equal(it.u.sample->key, "b");
  sf_item_clear(&it);
  assert_int_equal(sf_handoff_get(h, &it, &status, msg, sizeof msg), 0);
  assert_int_equal(status, SF_EINVAL);
  assert_string_equal(msg, "python map f raised ValueError: c");
  assert_string_equal(it.u.sample->key, "c");
  sf_item_clear(&it);
  assert_int_equal(sf_handoff_in_flight(h), 0);
  sf_handoff_unref(&h); /* the last reference: freed (ASan sees a leak or a double free) */
  assert_null(h);
}

static void test_close_while_held(void **state) {
  (void)state;
  sf_handoff *h;
  assert_int_equal(sf_handoff_new(&h, 2), 0);
  put(h, sample_item("a", 1));
  put(h, sample_item("b", 2));
  sf_sample *s;
  assert_int_equal(sf_handoff_take(h, &s, 0), 0);
  sf_handoff_close(h); /* b is freed now; a when its finish comes */
  assert_int_equal(s->fields[0].tensor.shape[0], 3); /* still readable (ASan would say otherwise) */
  sf_sample *out = sf_sample_derive(s);
  sf_handoff_finish(h, &out, SF_HANDOFF_PASS, NULL);
  assert_null(out);
  assert_int_equal(sf_handoff_take(h, &s, -1), SF_EOF);
  sf_item it = sample_item("c", 3);
  assert_int_equal(sf_handoff_put(h, &it), SF_EAGAIN);
  sf_item_clear(&it);
  sf_handoff_unref(&h);
}

static void *serve(void *arg) { /* the program's thread: doubles every byte */
  sf_handoff *h = arg;
  sf_sample *s;
  while (sf_handoff_take(h, &s, -1) == 0) {
    sf_sample *out = sf_sample_derive(s);
    const sf_field *f = sf_sample_field_at(s, 0);
    uint8_t d[3];
    for (int i = 0; i < 3; i++) d[i] = (uint8_t)(((uint8_t *)sf_tensor_data(&f->tensor))[i] * 2);
    int64_t shape[1] = {3};
    sf_sample_add_field_copy(out, "bin", true, SF_DTYPE_UINT8, 1, shape, d);
    sf_handoff_finish(h, &out, SF_HANDOFF_PASS, NULL);
  }
  return NULL;
}

static int wakes;
static void count_wake(sf_node *node) {
  (void)node;
  wakes++;
}

static void test_thread(void **state) {
  (void)state;
  sf_handoff *h;
  assert_int_equal(sf_handoff_new(&h, 8), 0);
  sf_handoff_set_wake(h, count_wake, NULL);
  pthread_t t;
  pthread_create(&t, NULL, serve, h);
  int sent = 0, got = 0;
  while (got < 1000) {
    sf_item it;
    int status;
    if (sf_handoff_get(h, &it, &status, NULL, 0) == 0) {
      assert_int_equal(status, SF_HANDOFF_PASS);
      char key[16];
      snprintf(key, sizeof key, "%d", got);
      assert_string_equal(it.u.sample->key, key); /* in order */
      assert_int_equal(((uint8_t *)sf_tensor_data(&it.u.sample->fields[0].tensor))[0], (uint8_t)(got * 2));
      sf_item_clear(&it);
      got++;
    } else if (sent < 1000 && sf_handoff_can_put(h)) {
      char key[16];
      snprintf(key, sizeof key, "%d", sent);
      put(h, sample_item(key, (uint8_t)sent++));
    } else {
      sched_yield();
    }
  }
  sf_handoff_close(h);
  pthread_join(t, NULL);
  sf_handoff_set_wake(h, NULL, NULL);
  assert_true(wakes > 0);
  sf_handoff_unref(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_results_in_order),
      cmocka_unit_test(test_close_while_held),
      cmocka_unit_test(test_thread),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
