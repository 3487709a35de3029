/*
 * Who frees a buffer: the free function and opaque pointer sf_buffer_wrap() was given. Engine-internal: how a
 * pool tells its own buffers from others (sf_pool_owns).
 */
#ifndef SF_BUFFER_FREER_H
#define SF_BUFFER_FREER_H

#include "shardflow/buffer.h"

/* The free function of buffer (NULL for sf_buffer_new's and for NULL), and its opaque pointer in *opaque. */
sf_buffer_free_fn sf_buffer_freer(const sf_buffer *buffer, void **opaque);

#endif
