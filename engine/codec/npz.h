/* NumPy .npz archives (np.savez, np.savez_compressed): a zip of .npy members, read with libzip. */
#ifndef SF_ENGINE_NPZ_H
#define SF_ENGINE_NPZ_H

#include <stddef.h>
#include <stdint.h>

#include "shardflow/codec.h"
#include "shardflow/error.h"
#include "shardflow/tensor.h"

/* sf_npz_read and its callback type sf_npz_array_fn are public: include/shardflow/codec.h. */

#endif
