/* The scan entries of the JPEGs region decodes have walked: see jpeg_entries.h. */
#include "jpeg_entries.h"

#include "log.h"

#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- the key: a keyed hash of the JPEG's bytes ---- */

/*
 * Whoever writes a dataset chooses its bytes. With a public hash as the key (XXH64 was), 16 changed bytes make a
 * second JPEG of the same size and key, whose regions would start at the first one's entries and come out wrong.
 * So the key is keyed by random bytes drawn once a process, which nobody outside it knows: GMAC (the tag of
 * AES-256-GCM over the bytes as associated data, NIST SP 800-38D: about 5 us for a 31 KB photograph) where the CPU has
 * AES-NI and carry-less multiply, else SipHash-2-4 (14 us); both libsodium's. The key is the tag's first 64 bits.
 * The tags never leave the process, so one nonce for all of them gives nothing away.
 */
static struct {
  pthread_once_t once;
  bool ready, gmac;
  crypto_aead_aes256gcm_state gcm;
  unsigned char siphash[crypto_shorthash_KEYBYTES];
} keyed = {.once = PTHREAD_ONCE_INIT};

static void draw_keys(void) {
  if (sodium_init() < 0) return;
  unsigned char gcm[crypto_aead_aes256gcm_KEYBYTES];
  randombytes_buf(gcm, sizeof gcm);
  keyed.gmac = crypto_aead_aes256gcm_is_available() && crypto_aead_aes256gcm_beforenm(&keyed.gcm, gcm) == 0;
  sodium_memzero(gcm, sizeof gcm);
  randombytes_buf(keyed.siphash, sizeof keyed.siphash);
  keyed.ready = true;
}

bool sf_jpeg_entries_key(const uint8_t *data, size_t size, uint64_t *key) {
  pthread_once(&keyed.once, draw_keys);
  if (!keyed.ready) return false;
  unsigned char tag[crypto_aead_aes256gcm_ABYTES];
  if (keyed.gmac) {
    static const unsigned char nonce[crypto_aead_aes256gcm_NPUBBYTES], none[1];
    unsigned char nothing[1]; /* the ciphertext of no plaintext */
    unsigned long long tag_size;
    crypto_aead_aes256gcm_encrypt_detached_afternm(nothing, tag, &tag_size, none, 0, data, size, NULL, nonce,
                                                   &keyed.gcm);
  } else {
    crypto_shorthash(tag, data, size, keyed.siphash);
  }
  memcpy(key, tag, sizeof *key);
  return true;
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
           "JPEG scan entries: the %zu MiB budget is full (%zu JPEGs kept); a region of a JPEG not kept walks its "
           "scan from the top each time (more CPU, same pixels)",
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
