/* The engine's side of device pools (include/shardflow/device.h): a pool opened on a given driver table. */
#ifndef SF_ENGINE_DEVICE_H
#define SF_ENGINE_DEVICE_H

#include "cuda_driver.h"
#include "shardflow/device.h"

/*
 * Everything a pool does goes through an sf_cuda_api table: the driver's (sf_cuda_load), which
 * sf_device_pool_open uses, or a unit test's fake. Opens GPU `ordinal` through api as
 * sf_device_pool_open does, with the same results, except that the driver is not loaded here. Borrows
 * api (static, or outliving every buffer of the pool).
 */
int sf_device_pool_new(sf_device_pool **pool, const sf_cuda_api *api, int ordinal, sf_error *error);

#endif
