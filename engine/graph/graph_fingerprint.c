/*
 * The order fingerprint: a SHA-256 of what decides which samples each batch of an epoch holds and in which
 * order, so that a saved position (epoch, step) is only resumed by a graph that rebuilds the same batches.
 * What counts and what does not is documented with sf_graph_order_fingerprint (include/shardflow/shardflow.h)
 * and in docs/resume.md.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "graph.h"
#include "options.h"

/*
 * Options of the built-in stages that change only a sample's bytes, a batch's layout, where things are kept,
 * or speed: never which samples an epoch holds, their order, or where batches are cut. "STAGE.*" leaves out
 * every option of a stage. Everything not listed counts once set away from its default (hash_node), so an
 * option added later with a default that keeps today's behaviour leaves saved states valid, and a plugin's
 * options count without being listed.
 */
static const char *const order_free[] = {
    /* a permission; how a resumed epoch is read (elastic resume), not what the epochs hold */
    "shard_source.allow_pipe",
    "shard_source.plan",
    "shard_source.start",
    "shard_source.index_dir",
    /* how and how fast shards arrive, and where they are kept */
    "tar_split.connect_timeout",
    "tar_split.stall_timeout",
    "tar_split.prefetch",
    "tar_split.prefetch_bytes",
    "tar_split.retries",
    "tar_split.retry_wait",
    "tar_split.retry_max_wait",
    "tar_split.cache_dir",
    "tar_split.cache_size",
    "tar_split.mmap",
    "tar_split.ca_file",
    "tar_split.dead_host_shards",
    /* pixels only (its limits count: they decide which samples are dropped) */
    "decode.mode",
    "decode.min_size",
    "decode.depth",
    "decode.defer_jpeg",
    /* pixels only; augment draws from its own random stream */
    "augment.*",
    /* a batch's layout and memory */
    "batch.ragged",
    "batch.pad",
    "batch.pin_memory",
    /* dumps and previews of what the trainer gets */
    "device_sink.*",
    /* how many samples wait for the Python thread */
    "python.in_flight",
};

static bool counts(const char *stage, const char *option) {
  size_t len = strlen(stage);
  for (size_t i = 0; i < sizeof order_free / sizeof *order_free; i++) {
    const char *e = order_free[i];
    if (strncmp(e, stage, len) == 0 && e[len] == '.' &&
        (strcmp(e + len + 1, "*") == 0 || strcmp(e + len + 1, option) == 0))
      return false;
  }
  return true;
}

/* One field of the hashed text: "TAG LENGTH:VALUE\n", unambiguous whatever the value holds. */
static bool put(EVP_MD_CTX *md, const char *tag, const char *value) {
  char head[64];
  size_t n = strlen(value);
  int h = snprintf(head, sizeof head, "%s %zu:", tag, n);
  return h > 0 && (size_t)h < sizeof head && EVP_DigestUpdate(md, head, (size_t)h) && EVP_DigestUpdate(md, value, n) &&
         EVP_DigestUpdate(md, "\n", 1);
}

/* The value an option row parsed into priv, as text independent of how it was written ("10k" = "10000"). */
static void option_text(const sf_option *o, const void *priv, char *buf, size_t size) {
  const char *p = (const char *)priv + o->offset;
  switch (o->type) {
  case SF_OPT_BOOL: snprintf(buf, size, "%s", *(const bool *)p ? "true" : "false"); break;
  case SF_OPT_INT:
  case SF_OPT_COUNT:
  case SF_OPT_SIZE: snprintf(buf, size, "%" PRId64, *(const int64_t *)p); break;
  case SF_OPT_FLOAT:
  case SF_OPT_DURATION: snprintf(buf, size, "%.17g", *(const double *)p); break;
  case SF_OPT_SEED: snprintf(buf, size, "%" PRIu64, *(const uint64_t *)p); break;
  case SF_OPT_ENUM: {
    int v = *(const int *)p, i = 0;
    const char *name = NULL;
    for (const char *const *e = o->enum_names; e && *e && !name; e++, i++)
      if (i == v) name = *e;
    snprintf(buf, size, "%s", name ? name : "?");
    break;
  }
  case SF_OPT_FLOAT_LIST: {
    const sf_float_list *l = (const sf_float_list *)p;
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < l->n && i < SF_FLOAT_LIST_MAX && len < size; i++)
      len += (size_t)snprintf(buf + len, size - len, "%s%.17g", i ? "," : "", l->v[i]);
    break;
  }
  case SF_OPT_STRING: /* put() takes the string itself: it may be longer than buf */
  default: buf[0] = '\0'; break;
  }
}

/*
 * The value of option o in priv, as hashed: a string option as itself, a name list as its items joined by ","
 * (what the same option gave as a comma-separated string before it was a list: saved fingerprints still
 * match), both of any length: a name list's text is allocated in *heap (free it; NULL when it fails).
 */
static const char *hashed_value(const sf_option *o, const void *priv, char *buf, size_t size, char **heap) {
  *heap = NULL;
  if (o->type == SF_OPT_NAME_LIST) {
    const sf_name_list *l = (const sf_name_list *)((const char *)priv + o->offset);
    size_t len = 1;
    for (int i = 0; i < l->n; i++) len += strlen(l->v[i]) + 1;
    if (!(*heap = malloc(len))) return NULL;
    char *at = *heap;
    *at = '\0';
    for (int i = 0; i < l->n; i++) at += sprintf(at, "%s%s", i ? "," : "", l->v[i]);
    return *heap;
  }
  if (o->type != SF_OPT_STRING) {
    option_text(o, priv, buf, size);
    return buf;
  }
  const char *value = *(char *const *)((const char *)priv + o->offset);
  return value ? value : "";
}

/*
 * Hashes node i: name, type, the nodes feeding its ports, then the options that count and differ from their
 * defaults, in table order (so a new option at its default leaves every fingerprint as it was).
 */
static int hash_node(EVP_MD_CTX *md, const sf_graph *g, int i, const sf_stage_def *def, const int *inputs,
                     sf_error *e) {
  const sf_graph_node *n = &g->nodes[i];
  if (!put(md, "node", n->name) || !put(md, "type", def->name))
    return sf_graph_error(e, SF_ENOMEM, g, -1, "SHA-256 failed");
  for (int port = 0; port < SF_GRAPH_MAX_INPUTS && inputs[i * SF_GRAPH_MAX_INPUTS + port] >= 0; port++)
    if (!put(md, "input", g->nodes[inputs[i * SF_GRAPH_MAX_INPUTS + port]].name))
      return sf_graph_error(e, SF_ENOMEM, g, -1, "SHA-256 failed");
  void *priv, *defaults = NULL;
  sf_graph_node blank = *n; /* the same node with no option written: the defaults */
  blank.values = NULL;
  blank.n_values = 0;
  int r = sf_graph_node_apply(g, n, def, &priv, e);
  if (r < 0) return r;
  r = sf_graph_node_apply(g, &blank, def, &defaults, e);
  for (const sf_option *o = def->options; o && o->name && r == 0; o++) {
    if (!counts(def->name, o->name)) continue;
    char text[512], default_text[512], *heap, *default_heap;
    const char *value = hashed_value(o, priv, text, sizeof text, &heap);
    const char *default_value = hashed_value(o, defaults, default_text, sizeof default_text, &default_heap);
    if (!value || !default_value)
      r = sf_graph_error(e, SF_ENOMEM, g, -1, "out of memory");
    else if (strcmp(value, default_value) != 0 && (!put(md, "option", o->name) || !put(md, "value", value)))
      r = sf_graph_error(e, SF_ENOMEM, g, -1, "SHA-256 failed");
    free(heap);
    free(default_heap);
  }
  sf_options_free(def->options, priv);
  free(priv);
  if (defaults) sf_options_free(def->options, defaults);
  free(defaults);
  return r;
}

int sf_graph_order_fingerprint(const sf_graph *g, char *buf, size_t size, sf_error *e) {
  if (buf && size) buf[0] = '\0';
  if (!g || !buf || size < SF_ORDER_FINGERPRINT_SIZE) {
    if (e)
      sf_error_set(e, SF_EINVAL, SF_NOWHERE, "sf_graph_order_fingerprint: give a graph and a buffer of %d bytes",
                   SF_ORDER_FINGERPRINT_SIZE);
    return SF_EINVAL;
  }
  int *order, *inputs;
  const sf_stage_def **defs;
  int r = sf_graph_resolve_links(g, &order, &defs, &inputs, e);
  if (r < 0) return r;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  char seed[32];
  snprintf(seed, sizeof seed, "%" PRIu64, g->seed);
  /* The version tag: a later rule for what counts gives other fingerprints, never equal ones by accident. */
  if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL) || !put(md, "shardflow order fingerprint", "2") ||
      !put(md, "seed", seed))
    r = sf_graph_error(e, SF_ENOMEM, g, -1, "SHA-256 failed (out of memory)");
  for (int k = 0; k < g->n_nodes && r == 0; k++)
    r = hash_node(md, g, order[k], defs[order[k]], inputs, e);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (r == 0 && (!EVP_DigestFinal_ex(md, digest, &len) || len != 32))
    r = sf_graph_error(e, SF_ENOMEM, g, -1, "SHA-256 failed (out of memory)");
  for (unsigned int i = 0; r == 0 && i < len; i++)
    snprintf(buf + 2 * i, 3, "%02x", digest[i]);
  EVP_MD_CTX_free(md);
  free(order);
  free(defs);
  free(inputs);
  return r;
}
