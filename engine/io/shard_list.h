/* Shard lists: brace expansion ({000..649} keeps padding, {a,b}), '::' joins, list files. */
#ifndef SF_ENGINE_SHARD_LIST_H
#define SF_ENGINE_SHARD_LIST_H

#include <stddef.h>

#include "shardflow/error.h"

typedef struct sf_shard_list {
  char **urls;
  size_t count;
} sf_shard_list;

/*
 * Expands a shard list spec into URLs, in order. Several patterns are joined
 * with "::". Brace groups: {000000..000649} (zero padding of the wider bound
 * kept), {a,b,c}; groups may repeat and nest left to right as in bash.
 * "@FILE" reads one URL (or pattern) per line from FILE ('#' comments).
 * An s3:// or gs:// URL ending in '/' is a prefix: it expands to every
 * .tar, .tar.gz, .tgz and .tar.zst object under it, sorted by key (a
 * listing request to the store, see sf_object_list); SF_ENOENT when there
 * are none, and the store's errors (SF_EDENIED, SF_ENET) as they come.
 * Returns 0, SF_EINVAL with *error naming the pattern and column, SF_ETOOBIG
 * past 10,000,000 URLs, SF_ENOMEM. The caller frees with sf_shard_list_clear().
 */
int sf_shard_list_expand(sf_shard_list *list, const char *spec, sf_error *error);

void sf_shard_list_clear(sf_shard_list *list);

#endif
