/* WebDataset samples from a tar stream: plain ustar members parsed here, the rest by libarchive's tar reader; .tar.gz and .tar.zst decompressed here, their checks verified. TFRecord shards (.tfrecord) read as records of tf.train.Example. */
#ifndef SF_ENGINE_TAR_READER_H
#define SF_ENGINE_TAR_READER_H

#include "shard_reader.h"
#include "tfrecord.h"
#include "shardflow/sample.h"
#include "shardflow/shard_io.h"

/* The reader's type and most of its functions are public (shardflow/shard_io.h); the index's part is here. */

/*
 * Right after sf_tar_reader_next() returned a sample: the stream offset where the bytes after it
 * start (the next sample's first member header, or the archive's end-of-archive blocks), so that
 * [sample->offset, this) is the sample's span, the members passed over after it included (an
 * index, engine/io/shard_index.h). -1 when not known: after a failure, in a TFRecord shard.
 */
int64_t sf_tar_reader_next_offset(const sf_tar_reader *t);

/* Bytes taken from the shard so far (raw, before decompression): after SF_EOF, normally the shard's size. */
int64_t sf_tar_reader_source_bytes(const sf_tar_reader *t);

#endif
