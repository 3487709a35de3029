/* The library's log site: every line it writes goes through sf_log() to the handler (shardflow/log.h). */
#ifndef SF_ENGINE_LOG_H
#define SF_ENGINE_LOG_H

#include "shardflow/log.h"

/* SF_LOG_UNPREFIXED, or-ed into a level, is public (shardflow/log.h). */

/*
 * Formats one record (fmt, printf-style, one line without a newline; cut at
 * 4 KiB) and hands it to the handler.  stage: a node name, or NULL (or "")
 * for the engine.  Callable from any thread.
 */
void sf_log(int level, const char *stage, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
