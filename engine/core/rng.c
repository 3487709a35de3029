/* Seed mixing (splitmix64) and the xoshiro256** generator stages draw from. */
#include "shardflow/stage.h"

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t sf_seed_mix(uint64_t seed, uint64_t word) {
  uint64_t s = seed ^ (word * 0xd6e8feb86659fd93ull);
  return splitmix64(&s);
}

void sf_rng_seed(sf_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sf_rng_next(sf_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

uint64_t sf_rng_below(sf_rng *r, uint64_t n) {
  if (n == 0) return 0;
  /* Lemire's nearly-divisionless method (ACM TOMACS 2019). */
  __uint128_t m = (__uint128_t)sf_rng_next(r) * n;
  uint64_t low = (uint64_t)m;
  if (low < n) {
    uint64_t threshold = -n % n;
    while (low < threshold) {
      m = (__uint128_t)sf_rng_next(r) * n;
      low = (uint64_t)m;
    }
  }
  return (uint64_t)(m >> 64);
}

double sf_rng_double(sf_rng *r) { return (double)(sf_rng_next(r) >> 11) * 0x1.0p-53; }
