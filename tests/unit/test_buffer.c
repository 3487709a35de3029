/* Buffers, tensors, samples: refcounts, views without copies, shapes and strides. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "huge_map.h"
#include "shardflow/stage.h"

static int freed;
static void count_free(void *opaque, uint8_t *data) {
  freed++;
  assert_ptr_equal(opaque, data);
}

static void test_refcount(void **state) {
  sf_buffer *b = sf_buffer_new(100);
  assert_non_null(b);
  assert_int_equal(sf_buffer_size(b), 100);
  assert_int_equal((uintptr_t)sf_buffer_data(b) % 16, 0);
  assert_true(sf_buffer_is_writable(b));
  sf_buffer *c = sf_buffer_ref(b);
  assert_false(sf_buffer_is_writable(b));
  sf_buffer_unref(&c);
  assert_null(c);
  assert_true(sf_buffer_is_writable(b));
  sf_buffer_unref(&b);
  sf_buffer_unref(&b); /* NULL-safe */

  static uint8_t data[10];
  freed = 0;
  sf_buffer *w = sf_buffer_wrap(data, sizeof data, count_free, data);
  sf_buffer *w2 = sf_buffer_ref(w);
  sf_buffer_unref(&w);
  assert_int_equal(freed, 0);
  sf_buffer_unref(&w2);
  assert_int_equal(freed, 1);
}

static void test_tensor_view(void **state) {
  sf_buffer *b = sf_buffer_new(3 * 4 * 2 + 7);
  sf_tensor t;
  int64_t shape[3] = {3, 4, 2};
  assert_int_equal(sf_tensor_view(&t, SF_DTYPE_UINT8, 3, shape, sf_buffer_ref(b), 7), 0);
  assert_ptr_equal(sf_tensor_data(&t), sf_buffer_data(b) + 7); /* a view, not a copy */
  assert_int_equal(t.strides[0], 8);
  assert_int_equal(t.strides[1], 2);
  assert_int_equal(t.strides[2], 1);
  assert_true(sf_tensor_is_contiguous(&t));
  assert_int_equal(sf_tensor_nbytes(&t), 24);
  sf_tensor u;
  sf_tensor_ref(&u, &t);
  sf_tensor_clear(&t);
  assert_non_null(u.buffer);
  sf_tensor_clear(&u);
  /* a view past the end is refused */
  int64_t big[1] = {100};
  assert_int_equal(sf_tensor_view(&t, SF_DTYPE_FLOAT32, 1, big, sf_buffer_ref(b), 0), SF_ETOOBIG);
  assert_null(t.buffer);
  assert_true(sf_buffer_is_writable(b)); /* the refused view dropped its reference */
  sf_buffer_unref(&b);
  int64_t neg[1] = {-1};
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_INT64, 1, neg), SF_EINVAL);
  int64_t huge[1] = {INT64_C(1) << 62}; /* fits as elements, not as float32 bytes */
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_FLOAT32, 1, huge), SF_EINVAL);
  assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_BFLOAT16, 0, NULL), 0);
  assert_int_equal(sf_tensor_numel(&t), 1);
  assert_int_equal(sf_tensor_nbytes(&t), 2);
  sf_tensor_clear(&t);
  assert_string_equal(sf_dtype_name(SF_DTYPE_FLOAT32), "float32");
}

static void test_sample_fields(void **state) {
  sf_sample *s = sf_sample_new();
  for (int i = 0; i < SF_MAX_FIELDS; i++) {
    sf_tensor t;
    int64_t n = i + 1;
    assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_UINT8, 1, &n), 0);
    char name[16];
    snprintf(name, sizeof name, "f%d", i);
    assert_non_null(sf_sample_add_field(s, name, true, &t));
    assert_null(t.buffer);
  }
  sf_tensor extra;
  int64_t one = 1;
  sf_tensor_alloc(&extra, SF_DTYPE_UINT8, 1, &one);
  assert_null(sf_sample_add_field(s, "overflow", true, &extra));
  assert_null(extra.buffer); /* consumed even on failure */
  assert_non_null(sf_sample_field(s, "f3"));
  sf_sample_remove_field(s, 3);
  assert_null(sf_sample_field(s, "f3"));
  assert_int_equal(s->n_fields, SF_MAX_FIELDS - 1);
  assert_string_equal(sf_sample_url(s), "");
  sf_sample_destroy(&s);
  assert_null(s);
}

/* Destroyed samples are kept for reuse (engine/core/sample.c): a new one is as fresh as malloc's. */
static void test_sample_reuse(void **state) {
  for (int round = 0; round < 3; round++) {
    sf_sample *s = sf_sample_new();
    assert_non_null(s);
    assert_string_equal(s->key, "");
    assert_null(s->url);
    assert_int_equal(s->n_fields, 0);
    assert_int_equal(s->epoch + s->shard_index + s->index + s->pass, 0);
    assert_int_equal(s->offset, -1);
    assert_int_equal(sf_sample_set_key(s, "k", 1), 0);
    s->url = sf_buffer_new(4);
    s->epoch = s->shard_index = s->index = s->pass = 9;
    s->offset = 512;
    sf_tensor t;
    int64_t n = 3;
    assert_int_equal(sf_tensor_alloc(&t, SF_DTYPE_UINT8, 1, &n), 0);
    assert_non_null(sf_sample_add_field(s, "jpg", true, &t));
    sf_sample_destroy(&s);
  }
}

static int by_address(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (sf_sample *const *)a, y = (uintptr_t) * (sf_sample *const *)b;
  return x < y ? -1 : x > y;
}

/*
 * Many samples alive at once (a shuffle buffer's worth, over several of sample.c's 2 MiB slabs): each its own
 * sizeof(sf_sample) bytes, none overlapping, every field writable; destroyed, they come back fresh.
 */
static void test_many_samples(void **state) {
  (void)state;
  enum { N = 3000 };
  sf_sample **all = calloc(N, sizeof *all);
  assert_non_null(all);
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < N; i++) {
      all[i] = sf_sample_new();
      assert_non_null(all[i]);
      assert_int_equal(all[i]->n_fields, 0);
      assert_int_equal(all[i]->offset, -1);
      assert_int_equal((uintptr_t)all[i] % 16, 0);
      memset(all[i]->fields, 0xA5, sizeof all[i]->fields); /* the whole struct is the sample's */
      all[i]->index = (uint64_t)i;
    }
    for (int i = 0; i < N; i++) assert_int_equal(all[i]->index, (uint64_t)i);
    qsort(all, N, sizeof *all, by_address);
    for (int i = 1; i < N; i++) assert_true((uintptr_t)all[i] - (uintptr_t)all[i - 1] >= sizeof(sf_sample));
    for (int i = 0; i < N; i++) sf_sample_destroy(&all[i]);
  }
  free(all);
}

/* A recipe that counts how often it is destroyed. */
static int recipes_destroyed;
typedef struct counted_recipe {
  sf_field_recipe base;
  int value;
} counted_recipe;
static void counted_write(const sf_field_recipe *r, void *dst) { *(int32_t *)dst = ((const counted_recipe *)r)->value; }
static void counted_destroy(sf_field_recipe *r) {
  recipes_destroyed++;
  free(r);
}

/*
 * Compact samples (shuffle's buffer): sample i has i % 4 fields (an encoded view of a shared buffer, a deferred
 * field, a label), its key, URL, epoch and origin; compacted, they read back the same through
 * sf_compact_sample_fields() and, expanded, as the sample they were; destroyed either way, they drop every
 * reference and recipe. Thousands at once: sample.c's slots of each size must not overlap.
 */
static void test_compact_samples(void **state) {
  (void)state;
  enum { N = 3000 };
  sf_buffer *shared = sf_buffer_new(64), *url = sf_buffer_new(8);
  strcpy((char *)sf_buffer_data(url), "u.tar");
  sf_compact_sample **all = calloc(N, sizeof *all);
  assert_non_null(all);
  recipes_destroyed = 0;
  int recipes = 0;
  for (int i = 0; i < N; i++) {
    sf_sample *s = sf_sample_new();
    char key[16];
    snprintf(key, sizeof key, "k%d", i);
    assert_int_equal(sf_sample_set_key(s, key, strlen(key)), 0);
    s->url = sf_buffer_ref(url);
    s->epoch = (uint64_t)i % 3;
    s->shard_index = (uint64_t)i / 7;
    s->index = (uint64_t)i;
    s->offset = 512 * i;
    for (int f = 0; f < i % 4; f++) {
      sf_tensor t = {0};
      int64_t n = 16;
      if (f == 0) assert_int_equal(sf_tensor_view(&t, SF_DTYPE_UINT8, 1, &n, sf_buffer_ref(shared), 0), 0);
      sf_field *field = sf_sample_add_field(s, f == 0 ? "jpg" : f == 1 ? "img" : "cls", f == 0, &t);
      assert_non_null(field);
      if (f == 1) {
        counted_recipe *r = malloc(sizeof *r);
        *r = (counted_recipe){{counted_write, counted_destroy}, i};
        assert_int_equal(sf_field_defer(field, SF_DTYPE_INT32, 0, NULL, &r->base), 0);
        recipes++;
      }
    }
    all[i] = sf_sample_compact(&s);
    assert_non_null(all[i]);
    assert_null(s);
  }
  for (int i = 0; i < N; i++) {
    int n = -1;
    uint64_t epoch = 99;
    const sf_field *fields = sf_compact_sample_fields(all[i], &n, &epoch);
    assert_int_equal(n, i % 4);
    assert_int_equal(epoch, (uint64_t)i % 3);
    if (n > 1) {
      assert_string_equal(fields[1].name, "img");
      assert_int_equal(((const counted_recipe *)fields[1].recipe)->value, i);
    }
  }
  assert_false(sf_buffer_is_writable(shared));
  for (int i = 0; i < N; i++) {
    if (i % 2) {
      sf_compact_sample_destroy(&all[i]);
      assert_null(all[i]);
      continue;
    }
    sf_sample *s = sf_compact_sample_expand(&all[i]);
    assert_non_null(s);
    assert_null(all[i]);
    char key[16];
    snprintf(key, sizeof key, "k%d", i);
    assert_string_equal(s->key, key);
    assert_string_equal(sf_sample_url(s), "u.tar");
    assert_int_equal(s->index, (uint64_t)i);
    assert_int_equal(s->shard_index, (uint64_t)i / 7);
    assert_int_equal(s->offset, 512 * i);
    assert_int_equal(s->n_fields, i % 4);
    if (s->n_fields > 0) assert_ptr_equal(sf_tensor_data(&s->fields[0].tensor), sf_buffer_data(shared));
    if (s->n_fields > 1) {
      assert_int_equal(sf_field_materialize(&s->fields[1]), 0);
      assert_int_equal(*(const int32_t *)sf_tensor_data(&s->fields[1].tensor), i);
    }
    if (s->n_fields > 2) assert_string_equal(s->fields[2].name, "cls");
    sf_sample_destroy(&s);
  }
  assert_int_equal(recipes_destroyed, recipes);
  assert_true(sf_buffer_is_writable(shared)); /* every view dropped its reference */
  assert_true(sf_buffer_is_writable(url));
  sf_compact_sample_destroy(NULL);
  sf_buffer_unref(&shared);
  sf_buffer_unref(&url);
  free(all);
}

static void test_errors_table(void **state) {
  assert_string_equal(sf_err_name(SF_EFORMAT), "SF_EFORMAT");
  assert_string_equal(sf_err_name(12345), "SF_EUNKNOWN");
  assert_non_null(strstr(sf_strerror(SF_ENOMEM), "memory"));
  sf_error e = {.code = SF_EFORMAT, .offset = 1536, .line = -1};
  strcpy(e.stage, "tar_split");
  strcpy(e.url, "http://h/s.tar");
  strcpy(e.key, "0000007");
  strcpy(e.message, "truncated");
  char buf[256];
  assert_string_equal(sf_error_format(&e, buf, sizeof buf), "tar_split: http://h/s.tar @ byte 1536 (key 0000007): truncated");
}

static void test_rng(void **state) {
  sf_rng a, b;
  sf_rng_seed(&a, 7);
  sf_rng_seed(&b, 7);
  for (int i = 0; i < 100; i++) assert_int_equal(sf_rng_next(&a), sf_rng_next(&b));
  int hist[10] = {0};
  for (int i = 0; i < 100000; i++) hist[sf_rng_below(&a, 10)]++;
  for (int i = 0; i < 10; i++) assert_in_range(hist[i], 9000, 11000);
  assert_true(sf_seed_mix(1, 2) != sf_seed_mix(1, 3));
  assert_true(sf_seed_mix(1, 2) != sf_seed_mix(2, 2));
}

/* sf_huge_map: 2 MiB aligned, zeroed, writable to the end of the 2 MiB it rounds up to; unmapped again. */
static void test_huge_map(void **state) {
  const size_t bytes = 3 * (size_t)SF_HUGE_PAGE / 2;
  uint8_t *mem = sf_huge_map(bytes);
  assert_non_null(mem);
  assert_int_equal((uintptr_t)mem % SF_HUGE_PAGE, 0);
  for (size_t i = 0; i < 2 * (size_t)SF_HUGE_PAGE; i += 4096) assert_int_equal(mem[i], 0);
  memset(mem, 0x5a, 2 * (size_t)SF_HUGE_PAGE);
  assert_int_equal(mem[2 * (size_t)SF_HUGE_PAGE - 1], 0x5a);
  sf_huge_unmap(mem, bytes);
  sf_huge_unmap(NULL, bytes); /* nothing */
  assert_null(sf_huge_map(0));
  assert_null(sf_huge_map(SIZE_MAX));
  (void)state;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refcount),     cmocka_unit_test(test_tensor_view), cmocka_unit_test(test_sample_fields),
      cmocka_unit_test(test_sample_reuse),  cmocka_unit_test(test_many_samples), cmocka_unit_test(test_compact_samples),
      cmocka_unit_test(test_errors_table), cmocka_unit_test(test_rng), cmocka_unit_test(test_huge_map),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
