/* The registry behind recipe_source.h: a few (write, source, inner) kinds, filled once, read without a lock. */
#include "recipe_source.h"

#include <pthread.h>
#include <stdatomic.h>

typedef void (*write_fn)(const sf_field_recipe *, void *);

enum { KINDS = 4 };
static struct {
  _Atomic(write_fn) write; /* set last (release): a reader that sees it sees the rest */
  sf_recipe_source_fn source;
  sf_recipe_inner_fn inner;
} kinds[KINDS];
static pthread_mutex_t registering = PTHREAD_MUTEX_INITIALIZER;

void sf_recipe_source_register(write_fn write, sf_recipe_source_fn source, sf_recipe_inner_fn inner) {
  pthread_mutex_lock(&registering);
  for (int i = 0; i < KINDS; i++) {
    write_fn w = atomic_load_explicit(&kinds[i].write, memory_order_relaxed);
    if (w == write) break;
    if (!w) {
      kinds[i].source = source;
      kinds[i].inner = inner;
      atomic_store_explicit(&kinds[i].write, write, memory_order_release);
      break;
    }
  }
  pthread_mutex_unlock(&registering);
}

static int kind_of(const sf_field_recipe *recipe) {
  for (int i = 0; i < KINDS; i++) {
    write_fn w = atomic_load_explicit(&kinds[i].write, memory_order_acquire);
    if (!w) break;
    if (w == recipe->write) return i;
  }
  return -1;
}

const sf_field_recipe *sf_recipe_inner(const sf_field_recipe *recipe) {
  int k = kind_of(recipe);
  return k >= 0 && kinds[k].inner ? kinds[k].inner(recipe) : NULL;
}

const void *sf_recipe_source(const sf_field_recipe *recipe, size_t *size) {
  *size = 0;
  for (int depth = 0; recipe && depth < 4; depth++) {
    int k = kind_of(recipe);
    if (k < 0) return NULL;
    if (kinds[k].source) return kinds[k].source(recipe, size);
    recipe = kinds[k].inner ? kinds[k].inner(recipe) : NULL;
  }
  return NULL;
}
