/* The example plugin: one stage, `scale`, that multiplies a uint8 or float32 field by a factor (copy it to start yours). */
#include <math.h>
#include <stddef.h>

#include <shardflow/plugin.h>
#include <shardflow/stage.h>

/* The stage's private state: the engine allocates it zeroed and writes the options into it. */
typedef struct scale {
  char *field;   /* SF_OPT_STRING: engine-owned */
  double factor;
  bool warned;   /* this node said that values are clamped */
} scale;

static const sf_option scale_options[] = {
    {"field", SF_OPT_STRING, offsetof(scale, field), "ppm", 0, 0, "the decoded field to scale (uint8 or float32)", NULL},
    {"factor", SF_OPT_FLOAT, offsetof(scale, factor), "1", -1e6, 1e6,
     "multiplier; uint8 results are rounded to nearest (ties to even) and clamped to 0..255", NULL},
    {NULL},
};

/* Shows the stage's own counter from the start: 0 until a value is clamped. */
static int scale_init(sf_node *node) { return sf_node_counter_add(node, "clamped", 0); }

/*
 * Writes field * factor into a fresh tensor (the field's buffer may be shared: never write into it).
 * Returns 0 with *clamped the uint8 results that were out of 0..255, or a negative error.
 */
static int scale_field(const scale *s, sf_field *f, uint64_t *clamped) {
  int r = sf_field_materialize(f);
  if (r < 0) return r;
  sf_tensor out = {0};
  if ((r = sf_tensor_alloc(&out, f->tensor.dtype, f->tensor.ndim, f->tensor.shape)) < 0) return r;
  sf_tensor_copy_to(&f->tensor, sf_tensor_data(&out));
  int64_t n = sf_tensor_numel(&out);
  if (out.dtype == SF_DTYPE_FLOAT32) {
    float *v = sf_tensor_data(&out);
    for (int64_t i = 0; i < n; i++) v[i] = (float)(v[i] * s->factor);
  } else {
    uint8_t *v = sf_tensor_data(&out);
    for (int64_t i = 0; i < n; i++) {
      double x = nearbyint(v[i] * s->factor);
      *clamped += x < 0 || x > 255;
      v[i] = (uint8_t)fmin(255.0, fmax(0.0, x));
    }
  }
  sf_tensor_clear(&f->tensor);
  f->tensor = out; /* the field takes over out's reference */
  return 0;
}

/* The engine pops, passes epoch markers on, pushes and counts; map only changes the sample. */
static int scale_map(sf_node *node, sf_sample **ps) {
  scale *s = sf_node_priv(node);
  sf_sample *sample = *ps;
  sf_field *f = sf_sample_field(sample, s->field);
  if (!f || f->encoded || (f->tensor.dtype != SF_DTYPE_UINT8 && f->tensor.dtype != SF_DTYPE_FLOAT32)) {
    sf_node_error(node, SF_EINVAL, sf_sample_url(sample), sample->key, sample->offset,
                  "field '%s' is %s: scale takes a decoded uint8 or float32 field (put decode before it)", s->field,
                  !f ? "missing" : f->encoded ? "not decoded" : sf_dtype_name(f->tensor.dtype));
    return SF_EINVAL; /* the engine drops the sample: skipped, or the pipeline stops, as the graph's error_policy says */
  }
  uint64_t clamped = 0;
  int r = scale_field(s, f, &clamped);
  if (r < 0) {
    sf_node_error(node, r, sf_sample_url(sample), sample->key, sample->offset, "field '%s': out of memory", s->field);
    return r;
  }
  if (clamped) {
    sf_node_counter_add(node, "clamped", clamped); /* the stage table, --stats-json and /metrics show it */
    if (!s->warned) /* said once (per replica): the counter has the rest */
      sf_node_log(node, SF_LOG_WARNING, "factor %g takes uint8 values of '%s' out of 0..255 (first in sample %s): "
                  "they are clamped; the stage's counter `clamped` counts them", s->factor, s->field, sample->key);
    s->warned = true;
  }
  return 0;
}

static const sf_stage_def scale_stage = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "scale",
    .summary = "multiplies a uint8 or float32 field by `factor`",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP,
    .priv_size = sizeof(scale),
    .options = scale_options,
    .init = scale_init,
    .map = scale_map,
};

static const sf_stage_def *const example_stages[] = {&scale_stage, NULL};

static const sf_plugin example_plugin = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "example",
    .build_id = "example 1.0",
    .stages = example_stages,
};

/* The one symbol a plugin exports: the loader finds it by SF_PLUGIN_ENTRY. */
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void);
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void) { return &example_plugin; }
