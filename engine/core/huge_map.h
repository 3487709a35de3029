/* Anonymous memory in 2 MiB aligned mappings, advised for transparent huge pages. */
#ifndef SF_ENGINE_HUGE_MAP_H
#define SF_ENGINE_HUGE_MAP_H

#include <stddef.h>

/* The size of a huge page on x86-64 and arm64 (4 KiB base pages): the alignment of sf_huge_map's memory. */
enum { SF_HUGE_PAGE = 2 << 20 };

/*
 * bytes of zeroed, private, read-write memory that starts on a 2 MiB boundary, with
 * madvise(MADV_HUGEPAGE): where the kernel's transparent huge pages are `always` or `madvise`, each
 * 2 MiB of it faults in as one page (one fault and one TLB entry instead of 512). bytes is rounded up to
 * a multiple of 2 MiB (a huge page covers only whole 2 MiB of a mapping). The advice is advice: without
 * THP it is ordinary pages. Returns NULL when out of memory (mmap failed). Free with sf_huge_unmap and
 * the same bytes.
 */
void *sf_huge_map(size_t bytes);

/* Unmaps what sf_huge_map(bytes) returned; NULL does nothing. */
void sf_huge_unmap(void *mem, size_t bytes);

#endif
