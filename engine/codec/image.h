/*
 * Image codecs shared by the decode stage, `shardflow write` and the device sink's preview grid: sf_image_decode,
 * sf_image_format_known and sf_image_encode are public (include/shardflow/codec.h says what they do).
 */
#ifndef SF_ENGINE_IMAGE_H
#define SF_ENGINE_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "shardflow/codec.h"
#include "shardflow/error.h"
#include "shardflow/tensor.h"

#endif
