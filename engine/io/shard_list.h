/* Shard lists: brace expansion ({000..649} keeps padding, {a,b}), '::' joins, list files. sf_shard_list,
 * sf_shard_list_expand and sf_shard_list_clear are public (shardflow/shard_io.h says what they do). */
#ifndef SF_ENGINE_SHARD_LIST_H
#define SF_ENGINE_SHARD_LIST_H

#include "shardflow/shard_io.h"

#endif
