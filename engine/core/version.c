/* Library version, from the meson project version. */
#include "sf_config.h"
#include "shardflow/shardflow.h"

const char *sf_version_string(void) { return SF_VERSION; }

int sf_version(void) {
  int major = 0, minor = 0, patch = 0;
  const char *s = SF_VERSION;
  while (*s >= '0' && *s <= '9') major = major * 10 + (*s++ - '0');
  if (*s == '.') s++;
  while (*s >= '0' && *s <= '9') minor = minor * 10 + (*s++ - '0');
  if (*s == '.') s++;
  while (*s >= '0' && *s <= '9') patch = patch * 10 + (*s++ - '0');
  return major * 10000 + minor * 100 + patch;
}
