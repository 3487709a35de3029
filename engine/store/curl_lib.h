/*
 * libcurl, opened on first use (engine/core/dynlib.h) instead of linked: with the libraries it brings (TLS,
 * HTTP/2, SSH, LDAP, Kerberos: 33 in all here) it was 6.6 of the 15 ms every process of the CLI spent
 * starting, group workers and DataLoader workers included, whether or not it read a remote shard. Include
 * this, never <curl/curl.h>: the curl_* functions the engine calls are names for this table's entries, each
 * use opening the library if it is not open yet.
 */
#ifndef SF_ENGINE_CURL_LIB_H
#define SF_ENGINE_CURL_LIB_H

#define CURL_DISABLE_TYPECHECK 1 /* its checks are macros named as the functions, which the names below replace */
#include <curl/curl.h>

#include "dynlib.h"

#define SF_CURL_FUNCTIONS(X)                                                                                   \
  X(curl_global_init) X(curl_easy_init) X(curl_easy_setopt) X(curl_easy_getinfo) X(curl_easy_perform)          \
  X(curl_easy_cleanup) X(curl_easy_pause) X(curl_easy_strerror) X(curl_free) X(curl_getdate) X(curl_slist_append) \
  X(curl_slist_free_all) X(curl_multi_init) X(curl_multi_add_handle) X(curl_multi_remove_handle)                 \
  X(curl_multi_perform) X(curl_multi_poll) X(curl_multi_wakeup) X(curl_multi_info_read) X(curl_multi_cleanup)    \
  X(curl_url) X(curl_url_set) X(curl_url_get) X(curl_url_cleanup)
typedef struct sf_curl_fns {
  SF_CURL_FUNCTIONS(SF_DYNLIB_FIELD)
} sf_curl_fns;

/*
 * Opens libcurl the first time (thread-safe). Returns 0, or SF_EUNSUPPORTED with *why (owned by the
 * module) naming the soname, the loader's words and the package to install.
 */
int sf_curl_open(const char **why);

/* The table, libcurl opened first; a process where it cannot be opened stops with that message (exit 127). */
const sf_curl_fns *sf_curl(void);

#undef curl_easy_setopt  /* curl.h's own macros, checking the argument count */
#undef curl_easy_getinfo
#define curl_global_init (sf_curl()->curl_global_init)
#define curl_easy_init (sf_curl()->curl_easy_init)
#define curl_easy_setopt (sf_curl()->curl_easy_setopt)
#define curl_easy_getinfo (sf_curl()->curl_easy_getinfo)
#define curl_easy_perform (sf_curl()->curl_easy_perform)
#define curl_easy_cleanup (sf_curl()->curl_easy_cleanup)
#define curl_easy_pause (sf_curl()->curl_easy_pause)
#define curl_easy_strerror (sf_curl()->curl_easy_strerror)
#define curl_free (sf_curl()->curl_free)
#define curl_getdate (sf_curl()->curl_getdate)
#define curl_slist_append (sf_curl()->curl_slist_append)
#define curl_slist_free_all (sf_curl()->curl_slist_free_all)
#define curl_multi_init (sf_curl()->curl_multi_init)
#define curl_multi_add_handle (sf_curl()->curl_multi_add_handle)
#define curl_multi_remove_handle (sf_curl()->curl_multi_remove_handle)
#define curl_multi_perform (sf_curl()->curl_multi_perform)
#define curl_multi_poll (sf_curl()->curl_multi_poll)
#define curl_multi_wakeup (sf_curl()->curl_multi_wakeup)
#define curl_multi_info_read (sf_curl()->curl_multi_info_read)
#define curl_multi_cleanup (sf_curl()->curl_multi_cleanup)
#define curl_url (sf_curl()->curl_url)
#define curl_url_set (sf_curl()->curl_url_set)
#define curl_url_get (sf_curl()->curl_url_get)
#define curl_url_cleanup (sf_curl()->curl_url_cleanup)

#endif
