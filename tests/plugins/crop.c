/*
 * A test plugin: stage `crop`, a user's own augment written against include/shardflow/ only (the codec API): a
 * centre crop of size x size pixels (zero-padded when the image is smaller, torchvision's CenterCrop offsets),
 * optionally mirrored, normalised by mean/std into float32 CHW. A JPEG that decode left undecoded (defer_jpeg)
 * has only the crop's rows and columns decoded, as augment's own; a corrupt one is this stage's error record.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <shardflow/codec.h>
#include <shardflow/plugin.h>
#include <shardflow/stage.h>

typedef struct crop {
  char *field;          /* options */
  int64_t size;
  bool flip;
  sf_float_list mean, std;
  sf_buffer *tables;    /* from init: the output values, shared by every field this node transforms */
} crop;

static const sf_option crop_options[] = {
    {"field", SF_OPT_STRING, offsetof(crop, field), "jpg", 0, 0, "the decoded uint8 [H,W,C] image field", NULL},
    {"size", SF_OPT_INT, offsetof(crop, size), "8", 1, 4096, "output side in pixels", NULL},
    {"flip", SF_OPT_BOOL, offsetof(crop, flip), "false", 0, 0, "mirror every output horizontally", NULL},
    {"mean", SF_OPT_FLOAT_LIST, offsetof(crop, mean), "", 0, 0, "per-channel mean (empty: x/255 only)", NULL},
    {"std", SF_OPT_FLOAT_LIST, offsetof(crop, std), "", 0, 0, "per-channel standard deviation", NULL},
    {NULL},
};

static int crop_init(sf_node *node) {
  crop *c = sf_node_priv(node);
  if (c->mean.n != c->std.n) return sf_node_option_error(node, NULL, "mean and std need the same number of values");
  int r = sf_image_tables_new(c->mean.v, c->std.v, c->mean.n, &c->tables);
  if (r == SF_EINVAL) return sf_node_option_error(node, "std", "std values must be positive");
  return r;
}

static void crop_uninit(sf_node *node) {
  crop *c = sf_node_priv(node);
  sf_buffer_unref(&c->tables);
}

/* torchvision's CenterCrop offset of n pixels in extent (round half to even), negative when it pads. */
static int64_t centre(int64_t extent, int64_t n) {
  return extent >= n ? (int64_t)nearbyint((double)(extent - n) / 2.0) : -((n - extent) / 2);
}

static int crop_map(sf_node *node, sf_sample **ps) {
  const crop *c = sf_node_priv(node);
  sf_sample *s = *ps;
  sf_field *f = sf_sample_field(s, c->field);
  if (!f || f->encoded || f->tensor.dtype != SF_DTYPE_UINT8 || f->tensor.ndim != 3) {
    sf_node_error(node, SF_EINVAL, sf_sample_url(s), s->key, s->offset, "crop needs a decoded uint8 [H,W,C] field "
                  "'%s'", c->field);
    return SF_EINVAL;
  }
  sf_error e = {.code = 0};
  int r;
  /* SF_STAGE_TAKES_DEFERRED: the other fields' JPEGs left undecoded are decoded whole, here (errors are ours). */
  for (int i = 0; i < s->n_fields; i++)
    if (&s->fields[i] != f && (r = sf_image_decode_deferred(&s->fields[i], &e)) < 0) {
      if (r != SF_ENOMEM)
        sf_node_error(node, r, sf_sample_url(s), s->key, s->offset, "field '%s': %s", s->fields[i].name, e.message);
      return r;
    }
  /* A JPEG left undecoded is the source as it is; any other deferred field is materialised first. */
  bool jpeg = sf_image_is_deferred_jpeg(f);
  r = jpeg ? 0 : sf_field_materialize(f);
  if (r < 0) return r;
  const int64_t h = f->tensor.shape[0], w = f->tensor.shape[1];
  sf_image_transform t = {.y = {0, h, h, centre(h, c->size), c->size}, .x = {0, w, w, centre(w, c->size), c->size},
                          .flip = c->flip, .tables = c->tables, .dtype = SF_DTYPE_FLOAT32, .layout = SF_IMAGE_CHW,
                          .channels = (int)f->tensor.shape[2], .m = 8};
  sf_image_axis_reads(&t.y, &t.rect[0], &t.rect[2]); /* what to decode of a JPEG: the rows and columns read */
  sf_image_axis_reads(&t.x, &t.rect[1], &t.rect[3]);
  r = sf_image_transform_apply(f, &t, NULL, &e);
  if (r < 0 && r != SF_ENOMEM) /* a corrupt JPEG (or a plan that does not fit): the sample's error record */
    sf_node_error(node, r, sf_sample_url(s), s->key, s->offset, "field '%s': %s", f->name, e.message);
  return r;
}

static const sf_stage_def crop_stage = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "crop",
    .summary = "test stage: centre crop, flip and mean/std into float32 CHW through the public codec API",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP | SF_STAGE_TAKES_DEFERRED,
    .priv_size = sizeof(crop),
    .options = crop_options,
    .init = crop_init,
    .map = crop_map,
    .uninit = crop_uninit,
};

static const sf_stage_def *const crop_stages[] = {&crop_stage, NULL};

static const sf_plugin crop_plugin = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "crop",
    .build_id = "crop test 1.0",
    .stages = crop_stages,
};

SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void);
SF_PLUGIN_EXPORT const sf_plugin *sf_plugin_entry(void) { return &crop_plugin; }
