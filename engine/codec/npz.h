/* NumPy .npz archives (np.savez, np.savez_compressed): a zip of .npy members, read with libzip. */
#ifndef SF_ENGINE_NPZ_H
#define SF_ENGINE_NPZ_H

#include <stddef.h>
#include <stdint.h>

#include "shardflow/error.h"
#include "shardflow/tensor.h"

/*
 * Called once per array in archive order. name is the member's name without ".npy" (borrowed,
 * valid during the call); the callback takes over *array (transfer full) and leaves it zeroed.
 * Returns 0 to go on, or a negative SF_E code (with *error set) to stop.
 */
typedef int (*sf_npz_array_fn)(void *opaque, const char *name, sf_tensor *array, sf_error *error);

/*
 * Reads the .npz held by buffer at [offset, offset + size): each member NAME.npy (stored or
 * deflated; CRC checked by libzip) is inflated into a new buffer of at most max_member bytes and
 * read with sf_npy_read (so its array is a view of that buffer), then passed to fn. Members not
 * named *.npy are refused. Returns 0; SF_EFORMAT for a corrupt zip or .npy member (the message
 * names the member); SF_ETOOBIG for a member over max_member; SF_EUNSUPPORTED as sf_npy_read;
 * SF_ENOMEM; or what fn returned. Spec: numpy.lib.format, PKWARE APPNOTE (zip).
 */
int sf_npz_read(sf_buffer *buffer, size_t offset, size_t size, size_t max_member, sf_npz_array_fn fn, void *opaque,
                sf_error *error);

#endif
