/*
 * Azure Storage's Shared Key authorization (the "SharedKey" scheme of the Blob
 * service, version 2015-02-21 and later): the string to sign, its HMAC-SHA256
 * with the account key, and the Authorization header.  Pure functions over
 * strings: no I/O, no clock, so the signer can be checked against Azurite.
 */
#ifndef SF_ENGINE_SHAREDKEY_H
#define SF_ENGINE_SHAREDKEY_H

/* What one request is signed with. Every string is borrowed for the call. */
typedef struct sf_sharedkey_request {
  const char *method;         /* "GET", "PUT", ... */
  const char *account;        /* storage account name: "devstoreaccount1" */
  const char *encoded_path;   /* path as it goes on the wire, already URI-encoded ("/c/a%20b.tar"; on an emulator's
                                 path-style endpoint it starts with the account: "/devstoreaccount1/c/...") */
  const char *query;          /* query as it goes on the wire ("restype=container&comp=list"), or NULL/"" */
  long long content_length;   /* bytes of the body; 0 is signed as empty, as the scheme wants */
  const char *const *headers; /* NULL-terminated "Name: value" lines the request sends (x-ms-date, x-ms-version,
                                 Range, If-Match, Content-Type, ...), or NULL; Content-Length is not among them */
  const char *key_base64;     /* the account key as Azure shows it (base64) */
} sf_sharedkey_request;

/*
 * Builds the string to sign of r (the verb, the eleven standard header values
 * in their fixed order with Content-Length empty when 0, the x-ms-* headers
 * lower-cased and sorted by name, and the canonicalized resource
 * "/ACCOUNT/PATH" followed by "\nname:value" for every query parameter,
 * names lower-cased and sorted, values percent-decoded, repeated names
 * joined with ',') into a newly allocated string in *to_sign, and the
 * Authorization header's value "SharedKey ACCOUNT:SIGNATURE" into a newly
 * allocated string in *authorization.  Either output may be NULL when not
 * wanted; the caller frees both.
 * Returns 0; -1 when out of memory, -2 when the key is not base64 (outputs
 * set to NULL).
 */
int sf_sharedkey_sign(const sf_sharedkey_request *r, char **to_sign, char **authorization);

/* Writes time t (seconds since the epoch) as an RFC 1123 date in GMT, "Fri, 27 Nov 2026 09:00:00 GMT", into out. */
void sf_sharedkey_date(long long t, char out[32]);

#endif
