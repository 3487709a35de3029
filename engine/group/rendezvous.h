/*
 * Rendezvous files: how workers started by a scheduler (Slurm, Kubernetes)
 * find their head without anything typed by hand. The head writes one after
 * it has bound its listen endpoint; workers wait for it and read it.
 */
#ifndef SF_GROUP_RENDEZVOUS_H
#define SF_GROUP_RENDEZVOUS_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "shardflow/error.h"

/*
 * Writes path atomically (a temporary file renamed over it, mode 0644
 * whatever the umask): a
 * ZeroMQ certificate text (CZMQ's zcert format, the same as `shardflow
 * keygen`'s NAME.pub) whose metadata holds `endpoint = "tcp://HOST:PORT"` and
 * whose curve section holds the head's public key, so the file itself is the
 * worker's --server-key. endpoint is the bound endpoint (sf_transport_endpoint);
 * a wildcard host (0.0.0.0, *, [::]) is replaced by this host's name
 * (gethostname), the name other hosts reach it by. secret_key_file: the head's
 * key file (its public key is copied), or NULL for a plaintext group (the file
 * then says `plaintext = "true"`). Returns 0, or SF_EIO / key file errors with
 * *error naming the file.
 */
int sf_rendezvous_write(const char *path, const char *endpoint, const char *secret_key_file, sf_error *error);

/*
 * Waits until path exists (polling every 100 ms, up to timeout seconds, or
 * until *stop becomes nonzero; stop may be NULL) and reads its endpoint into
 * endpoint[size]; *plaintext tells whether the head has no key (otherwise
 * give path as the server key; whether to accept a plaintext head is the
 * caller's decision, never the file's). The file must be a regular file
 * (a FIFO is refused at once, never waited on), owned by this user or root
 * and not writable by group or others, in a directory of which the same
 * holds (sticky directories such as /tmp excepted), as OpenSSH checks key
 * files. Returns 0; SF_ETIMEDOUT when no file appeared (the message names the
 * file and says to check the head's `rendezvous:`), SF_ECANCELED when
 * stopped, SF_EFORMAT when the file has no endpoint, SF_EINVAL for a file
 * that is not a regular file, SF_EDENIED for one others could have written
 * (the message says what to chmod).
 */
int sf_rendezvous_read(const char *path, double timeout, volatile sig_atomic_t *stop, char *endpoint, size_t size,
                       bool *plaintext, sf_error *error);

#endif
