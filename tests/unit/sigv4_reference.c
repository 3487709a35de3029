/*
 * sigv4_reference METHOD URL QUERY EPOCH [PAYLOAD_SHA256]: prepares a request
 * for an s3:// or gs:// URL as the engine does (credentials, region and
 * endpoint from the environment) at a fixed time, and prints the http(s) URL,
 * each header, and the SigV4 canonical request, for test_sigv4.py to compare
 * with botocore.  QUERY "-" means none; PAYLOAD_SHA256 "-" or absent means
 * UNSIGNED-PAYLOAD.  Exit status 1 with the error record on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "object_store.h"

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: sigv4_reference METHOD URL QUERY|- EPOCH [PAYLOAD_SHA256|-]\n");
    return 2;
  }
  const char *query = strcmp(argv[3], "-") ? argv[3] : NULL;
  const char *hash = argc > 5 && strcmp(argv[5], "-") ? argv[5] : NULL;
  sf_object_request req;
  sf_error err;
  char *canonical = NULL;
  if (sf_object_request_prepare_at(argv[2], argv[1], query, hash, atoll(argv[4]), &req, &canonical, &err) < 0) {
    char line[2048];
    fprintf(stderr, "%s\n", sf_error_format(&err, line, sizeof line));
    return 1;
  }
  printf("URL %s\n", req.url);
  for (struct curl_slist *h = req.headers; h; h = h->next) printf("HEADER %s\n", h->data);
  printf("CREDENTIALS %s\n", req.credentials ? req.credentials : "");
  printf("CANONICAL\n%s\n", canonical ? canonical : "");
  free(canonical);
  sf_object_request_clear(&req);
  return 0;
}
