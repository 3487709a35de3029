/*
 * The scan entries region decodes have found, kept for the process's life (later epochs meet the same JPEGs):
 * for each JPEG, by its content, the entries of its iMCU rows 1 .. the deepest row walked so far. Safe to use
 * from any thread. The entries take at most a budget of memory (SF_JPEG_ENTRY_BUDGET, 64 MiB: about 200,000
 * JPEGs of 500 x 375 with 4:2:0 chroma walked to their last row); past it, JPEGs not yet kept are not added.
 */
#ifndef SF_ENGINE_JPEG_ENTRIES_H
#define SF_ENGINE_JPEG_ENTRIES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jpeg_scan.h"

enum { SF_JPEG_ENTRY_BUDGET = 64 << 20 };

/*
 * A JPEG's key: a hash of its bytes keyed by a secret of this process (GMAC or SipHash-2-4; see jpeg_entries.c), so
 * that nobody can make two JPEGs' keys collide. Writes *key and returns true; false when libsodium cannot start
 * (entries are then not used).
 */
bool sf_jpeg_entries_key(const uint8_t *data, size_t size, uint64_t *key);

/*
 * The deepest entry kept at or above iMCU row `row` of the JPEG with this key and size: its row, with the entry
 * in *out; 0 when none is kept (*out untouched); -1 when the JPEG was refused (sf_jpeg_entries_refuse).
 */
int sf_jpeg_entries_find(uint64_t key, size_t size, int row, sf_jpeg_entry *out);

/*
 * Keeps the entries e[0 .. n) of rows first .. first + n - 1 of the JPEG, where `first` is one past the deepest
 * row kept (what sf_jpeg_entries_find returned, plus one); entries another thread kept meanwhile stay. Beyond
 * the budget, or without memory, nothing is kept: the next decode walks again.
 */
void sf_jpeg_entries_add(uint64_t key, size_t size, int first, int n, const sf_jpeg_entry *e);

/* Marks the JPEG as one whose scan cannot be walked or resumed: later decodes do not try again. */
void sf_jpeg_entries_refuse(uint64_t key, size_t size);

/* Whether region decodes start at kept entries: yes unless SF_JPEG_ENTRIES=0 is in the environment (read once). */
bool sf_jpeg_entries_enabled(void);

/* Turns starting at kept entries on or off for the process, whatever the environment says: for tests. */
void sf_jpeg_entries_enable(bool on);

/* Forgets every JPEG and sets the budget in bytes (0: keep nothing, so every decode walks): for tests. */
void sf_jpeg_entries_reset(size_t budget);

#endif
