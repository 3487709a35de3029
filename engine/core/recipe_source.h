/*
 * Where a built-in deferred field's recipe reads its input, so that a stage holding the sample before
 * the batch (shuffle) can prefetch those bytes one or two samples ahead: in a large shuffle buffer the
 * source pixels are otherwise a cache miss inside recipe->write().  Engine-internal: the public
 * sf_field_recipe has no such member, and adding one would change the stage ABI for plugins.
 */
#ifndef SF_RECIPE_SOURCE_H
#define SF_RECIPE_SOURCE_H

#include <stddef.h>

#include "shardflow/sample.h"

/** Returns the first byte a recipe of this kind reads and sets *size to how many it reads from there. */
typedef const void *(*sf_recipe_source_fn)(const sf_field_recipe *recipe, size_t *size);
/** Returns the recipe a wrapping recipe of this kind runs (the node's timing wrapper), or NULL. */
typedef const sf_field_recipe *(*sf_recipe_inner_fn)(const sf_field_recipe *recipe);

/**
 * Tells the engine how to find the input of recipes whose write callback is `write`: `source` for one
 * that reads bytes, `inner` for one that wraps another recipe (either may be NULL).  Idempotent, safe
 * from any thread; at most a few kinds (the built-in ones) are kept, later ones are ignored.
 */
void sf_recipe_source_register(void (*write)(const sf_field_recipe *, void *), sf_recipe_source_fn source,
                               sf_recipe_inner_fn inner);

/** The input of recipe (through wrappers) as its registered kind says, or NULL (size 0) when not registered. */
const void *sf_recipe_source(const sf_field_recipe *recipe, size_t *size);

/** The recipe a registered wrapper runs, or NULL (not a wrapper, or not registered). */
const sf_field_recipe *sf_recipe_inner(const sf_field_recipe *recipe);

#endif
