/* A test plugin: stage `ids` turns a byte field into token-like int32 ids [n] (byte + 1000), so tests get 1-D fields of any length. */
#include <stddef.h>
#include <stdint.h>

#include <shardflow/plugin.h>
#include <shardflow/stage.h>

typedef struct ids {
  char *field; /* option */
} ids;

static const sf_option ids_options[] = {
    {"field", SF_OPT_STRING, offsetof(ids, field), "txt", 0, 0, "the uint8 [n] field (encoded or decoded) read", NULL},
    {NULL},
};

/* Appends "ids": int32 [n], ids[i] = field[i] + 1000. */
static int ids_map(sf_node *node, sf_sample **ps) {
  const ids *p = sf_node_priv(node);
  sf_sample *s = *ps;
  sf_field *f = sf_sample_field(s, p->field);
  if (!f || f->tensor.ndim != 1 || f->tensor.dtype != SF_DTYPE_UINT8) {
    sf_node_error(node, SF_EINVAL, sf_sample_url(s), s->key, s->offset, "ids needs a uint8 [n] field '%s'", p->field);
    return SF_EINVAL;
  }
  int r = sf_field_materialize(f);
  sf_tensor out = {0};
  if (r == 0) r = sf_tensor_alloc(&out, SF_DTYPE_INT32, 1, f->tensor.shape);
  if (r < 0) return r;
  const uint8_t *src = sf_tensor_data(&f->tensor);
  int32_t *dst = sf_tensor_data(&out);
  for (int64_t i = 0; i < out.shape[0]; i++) dst[i] = src[i * f->tensor.strides[0]] + 1000;
  return sf_sample_add_field(s, "ids", false, &out) ? 0 : SF_EINVAL;
}

static const sf_stage_def ids_stage = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "ids",
    .summary = "test stage: int32 ids [n] from a byte field",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP,
    .priv_size = sizeof(ids),
    .options = ids_options,
    .map = ids_map,
};

static const sf_stage_def *const ids_stages[] = {&ids_stage, NULL};

static const sf_plugin ids_plugin = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "ids",
    .build_id = "ids test 1.0",
    .stages = ids_stages,
};

SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void);
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void) { return &ids_plugin; }
