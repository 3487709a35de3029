/* shardflow error model: negative SF_E* codes, their names and strings, and error records. */
#ifndef SHARDFLOW_ERROR_H
#define SHARDFLOW_ERROR_H

#include <stdarg.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) || defined(__CYGWIN__)
#define SF_API
#else
/** Marks a symbol exported from libshardflow (everything else is hidden). */
#define SF_API __attribute__((visibility("default")))
#endif

/**
 * X-macro table of every error code: name, value, message.  The enum below,
 * sf_strerror() and sf_err_name() are all generated from it (libuv's model),
 * so a code and its text can never drift apart.
 *
 * SF_EAGAIN and SF_EOF are flow control (not ready / end of stream), never
 * failures shown to a user.
 */
#define SF_ERRNO_MAP(X)                                                              \
  X(EAGAIN, -1, "not ready yet (flow control, try again)")                           \
  X(EOF, -2, "end of stream")                                                        \
  X(ENOMEM, -3, "out of memory")                                                     \
  X(EINVAL, -4, "invalid argument")                                                  \
  X(EIO, -5, "input/output error")                                                   \
  X(ENOENT, -6, "no such file, URL or name")                                         \
  X(EFORMAT, -7, "malformed or corrupt data")                                        \
  X(ETOOBIG, -8, "size limit exceeded")                                              \
  X(EGRAPH, -9, "invalid graph file")                                                \
  X(EOPTION, -10, "invalid option or option value")                                  \
  X(ENET, -11, "network error (unreachable host, refused connection, HTTP error)")   \
  X(ETIMEDOUT, -12, "timed out")                                                     \
  X(EDUP, -13, "duplicate field in a sample")                                        \
  X(ESHAPE, -14, "tensor shapes or dtypes do not match")                             \
  X(EDENIED, -15, "not allowed (a pipe: URL without allow_pipe)")                    \
  X(ECANCELED, -16, "pipeline stopped")                                              \
  X(EUNSUPPORTED, -17, "unsupported format or feature")                              \
  X(EINTERNAL, -18, "internal error (a bug in shardflow; please report it)")         \
  X(EBUDGET, -19, "too much bad input: over max_errors / max_error_rate, or an empty epoch") \
  X(EMFILE, -20, "too many open files: the process's descriptor limit (raise ulimit -n) or the system's") \
  X(EHOSTDOWN, -21, "a shard server failed shard after shard the same way and served none (refused, unknown host, TLS, HTTP 401/403)")

/** Error codes.  0 is success; every code is negative. */
typedef enum sf_errno {
#define SF_ERRNO_ENUM(name, value, text) SF_##name = value,
  SF_ERRNO_MAP(SF_ERRNO_ENUM)
#undef SF_ERRNO_ENUM
} sf_errno;

/**
 * Human-readable text for an error code.
 * Returns a static string (never NULL); an unknown code gives "unknown error".
 */
SF_API const char *sf_strerror(int code);

/**
 * Symbolic name of an error code ("SF_EFORMAT").
 * Returns a static string (never NULL); an unknown code gives "SF_EUNKNOWN".
 */
SF_API const char *sf_err_name(int code);

/**
 * One error, as recorded by the pipeline (GStreamer's bus message, in spirit).
 *
 * Every field but code and message may be empty ("") or -1 when it does not
 * apply.  Records are owned by the pipeline or graph that produced them; the
 * strings are stored inline so a record can be copied by value.
 */
typedef struct sf_error {
  int code;              /**< negative SF_E* code */
  char stage[32];        /**< node name that raised it ("" for the engine) */
  char url[512];         /**< shard URL or graph file path */
  char key[128];         /**< sample key (__key__) */
  int64_t offset;        /**< byte offset in the shard's tar stream, or -1 */
  int64_t line;          /**< line in the graph file, or -1 */
  char message[512];     /**< what happened and what to do */
} sf_error;

/**
 * Where an error happened, as sf_error_set() takes it: the stage (node name), the shard URL or
 * graph file, the sample key, the byte offset in the shard's tar stream and the graph-file line.
 * Write it with SF_AT, naming only what applies:
 *
 *     return sf_error_set(error, SF_EFORMAT, SF_AT(.url = url, .offset = at), "truncated member %s", name);
 *
 * Unnamed strings are NULL (empty in the record), unnamed offset and line -1 (none). The strings
 * are borrowed for the call: sf_error_set() copies them into the record, cut to its fields.
 */
typedef struct sf_where {
  const char *stage; /**< node name, or NULL for the engine */
  const char *url;   /**< shard URL or graph file path, or NULL */
  const char *key;   /**< sample key (__key__), or NULL */
  int64_t offset;    /**< byte offset in the shard's tar stream, or -1 */
  int64_t line;      /**< line in the graph file, or -1 */
} sf_where;

/**
 * An sf_where from designated initialisers, defaults first: SF_AT(.url = u, .key = k).
 * (GCC's -Woverride-init and clang's -Winitializer-overrides, both in -Wextra, warn about the
 * intended override of a default; shardflow's build turns them off.)
 */
#define SF_AT(...) ((sf_where){.offset = -1, .line = -1, __VA_ARGS__})
/** No location: an error of the engine itself (out of memory, a bad argument). */
#define SF_NOWHERE SF_AT()

/**
 * Fills *error (when not NULL): code, where it happened (see sf_where) and the
 * message from fmt. Strings longer than their fields are cut.  Returns code, so
 * a caller can `return sf_error_set(...)`.
 */
SF_API int sf_error_set(sf_error *error, int code, sf_where where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/** sf_error_set() with a va_list. */
SF_API int sf_error_setv(sf_error *error, int code, sf_where where, const char *fmt, va_list args);

/**
 * Formats a record as one line: "stage: url @ offset (key): message".
 * Writes at most size bytes including the NUL into buf; returns buf.
 */
SF_API char *sf_error_format(const sf_error *error, char *buf, unsigned size);

#ifdef __cplusplus
}
#endif
#endif
