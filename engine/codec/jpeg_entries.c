/* The scan entries of the JPEGs region decodes have walked: see jpeg_entries.h. */
#include "jpeg_entries.h"

#include "log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- XXH64 (xxHash's doc/xxhash_spec.md), little-endian reads ---- */

static const uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                      P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;

static uint64_t rotl(uint64_t x, int r) { return x << r | x >> (64 - r); }

static uint64_t read64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

static uint64_t round64(uint64_t acc, uint64_t lane) { return rotl(acc + lane * P2, 31) * P1; }

static uint64_t merge(uint64_t acc, uint64_t v) { return (acc ^ round64(0, v)) * P1 + P4; }

uint64_t sf_jpeg_entries_key(const uint8_t *data, size_t size) {
  const uint8_t *p = data, *end = data + size;
  uint64_t acc;
  if (size >= 32) {
    uint64_t v[4] = {P1 + P2, P2, 0, -P1};
    for (; end - p >= 32; p += 32)
      for (int i = 0; i < 4; i++)
        v[i] = round64(v[i], read64(p + 8 * i));
    acc = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
    for (int i = 0; i < 4; i++)
      acc = merge(acc, v[i]);
  } else {
    acc = P5;
  }
  acc += (uint64_t)size;
  for (; end - p >= 8; p += 8)
    acc = rotl(acc ^ round64(0, read64(p)), 27) * P1 + P4;
  if (end - p >= 4) {
    acc = rotl(acc ^ ((uint64_t)(p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24) * P1), 23) * P2 + P3;
    p += 4;
  }
  for (; p < end; p++)
    acc = rotl(acc ^ *p * P5, 11) * P1;
  acc ^= acc >> 33, acc *= P2, acc ^= acc >> 29, acc *= P3;
  return acc ^ acc >> 32;
}

/* ---- the table: open addressing by key, grown at half full ---- */

typedef struct kept {
  uint64_t key;
  uint32_t size; /* of the JPEG; 0: an empty slot */
  int32_t rows;  /* the deepest row kept (entries of rows 1 .. rows), -1: refused */
  sf_jpeg_entry *e;
} kept;

static struct {
  pthread_mutex_t lock;
  kept *slots;
  size_t capacity, used, bytes, budget;
  bool full; /* the budget has turned entries away (said once) */
} table = {.lock = PTHREAD_MUTEX_INITIALIZER, .budget = SF_JPEG_ENTRY_BUDGET};

/* A fork while another thread holds the lock would leave it held in the child: the forking thread takes it first. */
static void before_fork(void) { pthread_mutex_lock(&table.lock); }
static void after_fork(void) { pthread_mutex_unlock(&table.lock); }
static void install_fork_handlers(void) { pthread_atfork(before_fork, after_fork, after_fork); }
static pthread_once_t fork_handlers = PTHREAD_ONCE_INIT;

static void lock(void) {
  pthread_once(&fork_handlers, install_fork_handlers);
  pthread_mutex_lock(&table.lock);
}

/* The slot of (key, size), or the empty one where it would go; NULL without a table. */
static kept *slot(uint64_t key, size_t size) {
  if (!table.capacity) return NULL;
  for (size_t i = key & (table.capacity - 1);; i = (i + 1) & (table.capacity - 1))
    if (!table.slots[i].size || (table.slots[i].key == key && table.slots[i].size == size)) return &table.slots[i];
}

/* Room for one more JPEG: the table doubled when half full, within the budget. */
static bool grow(void) {
  if (2 * (table.used + 1) <= table.capacity) return true;
  const size_t capacity = table.capacity ? 2 * table.capacity : 1024;
  if (table.bytes + capacity * sizeof(kept) > table.budget) return false;
  kept *slots = calloc(capacity, sizeof(kept));
  if (!slots) return false;
  kept *old = table.slots;
  const size_t n = table.capacity;
  table.slots = slots, table.capacity = capacity;
  for (size_t i = 0; i < n; i++)
    if (old[i].size) *slot(old[i].key, old[i].size) = old[i];
  table.bytes += capacity * sizeof(kept) - n * sizeof(kept);
  free(old);
  return true;
}

int sf_jpeg_entries_find(uint64_t key, size_t size, int row, sf_jpeg_entry *out) {
  lock();
  const kept *k = size && size <= UINT32_MAX ? slot(key, size) : NULL;
  int found = 0;
  if (k && k->size) {
    found = k->rows < row ? k->rows : row;
    if (found > 0) *out = k->e[found - 1];
  }
  pthread_mutex_unlock(&table.lock);
  return found;
}

/* The slot for (key, size), added when new and there is room; NULL otherwise. Under the lock. */
static kept *slot_for(uint64_t key, size_t size) {
  if (!size || size > UINT32_MAX) return NULL;
  kept *k = slot(key, size);
  if ((!k || !k->size) && grow()) {
    k = slot(key, size);
    *k = (kept){.key = key, .size = (uint32_t)size};
    table.used++;
  }
  return k && k->size ? k : NULL;
}

void sf_jpeg_entries_add(uint64_t key, size_t size, int first, int n, const sf_jpeg_entry *e) {
  lock();
  kept *k = slot_for(key, size);
  bool room = k && table.bytes + (size_t)n * sizeof *e <= table.budget, tell = !room && !table.full;
  if (room && k->rows >= 0 && first == k->rows + 1 && n > 0) {
    sf_jpeg_entry *grown = realloc(k->e, (size_t)(k->rows + n) * sizeof *e);
    if (grown) {
      memcpy(grown + k->rows, e, (size_t)n * sizeof *e);
      k->e = grown, k->rows += n;
      table.bytes += (size_t)n * sizeof *e;
    }
  }
  table.full |= tell;
  const size_t kept_jpegs = table.used, budget = table.budget;
  pthread_mutex_unlock(&table.lock);
  if (tell)
    sf_log(SF_LOG_INFO, "decode",
           "JPEG scan entries: the %zu MiB budget is full (%zu JPEGs kept); regions of JPEGs not kept skip the "
           "rows above them as libjpeg does, each time (more CPU, same pixels)",
           budget >> 20, kept_jpegs);
}

void sf_jpeg_entries_refuse(uint64_t key, size_t size) {
  lock();
  kept *k = slot_for(key, size);
  if (k) {
    table.bytes -= (size_t)(k->rows > 0 ? k->rows : 0) * sizeof *k->e;
    free(k->e);
    k->e = NULL, k->rows = -1;
  }
  pthread_mutex_unlock(&table.lock);
}

static atomic_int enabled; /* 0 not yet read from the environment, 1 off, 2 on */

bool sf_jpeg_entries_enabled(void) {
  int on = atomic_load_explicit(&enabled, memory_order_relaxed);
  if (!on) {
    const char *e = getenv("SF_JPEG_ENTRIES");
    on = e && strcmp(e, "0") == 0 ? 1 : 2;
    atomic_store_explicit(&enabled, on, memory_order_relaxed);
  }
  return on == 2;
}

void sf_jpeg_entries_enable(bool on) { atomic_store_explicit(&enabled, on ? 2 : 1, memory_order_relaxed); }

void sf_jpeg_entries_reset(size_t budget) {
  lock();
  for (size_t i = 0; i < table.capacity; i++)
    free(table.slots[i].e);
  free(table.slots);
  table.slots = NULL, table.capacity = table.used = table.bytes = 0, table.budget = budget, table.full = false;
  pthread_mutex_unlock(&table.lock);
}
