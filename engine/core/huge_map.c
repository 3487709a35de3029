/* 2 MiB aligned anonymous mappings: see huge_map.h. */
#include "huge_map.h"

#include <stdint.h>
#include <sys/mman.h>

static size_t whole_pages(size_t bytes) { return (bytes + SF_HUGE_PAGE - 1) & ~(size_t)(SF_HUGE_PAGE - 1); }

void *sf_huge_map(size_t bytes) {
  if (bytes == 0 || bytes > SIZE_MAX / 2 - SF_HUGE_PAGE) return NULL;
  const size_t size = whole_pages(bytes);
  /* Twice the size, then the aligned middle kept and the rest unmapped: mmap aligns to 4 KiB only. */
  uint8_t *raw = mmap(NULL, 2 * size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return NULL;
  uint8_t *mem = (uint8_t *)(((uintptr_t)raw + SF_HUGE_PAGE - 1) & ~(uintptr_t)(SF_HUGE_PAGE - 1));
  if (mem > raw) munmap(raw, (size_t)(mem - raw));
  if (raw + 2 * size > mem + size) munmap(mem + size, (size_t)(raw + 2 * size - (mem + size)));
  (void)madvise(mem, size, MADV_HUGEPAGE);
  return mem;
}

void sf_huge_unmap(void *mem, size_t bytes) {
  if (mem) munmap(mem, whole_pages(bytes));
}
