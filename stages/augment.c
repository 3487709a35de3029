/* augment: resize, crops (padded random, center, random resized), flip, normalize, layout and dtype in one pass,
 * for images [H,W,C] and for clips [T,H,W,C] (every frame with the sample's one draw). */
#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "shardflow/codec.h"
#include "shardflow/stage.h"

enum { CROP_NONE, CROP_RANDOM, CROP_CENTER, CROP_RANDOM_RESIZED };
/* hwc/chw name a frame's axes (a clip keeps T first); thwc/tchw/cthw name a clip's (an image has no T). */
enum { LAYOUT_HWC, LAYOUT_CHW, LAYOUT_THWC, LAYOUT_TCHW, LAYOUT_CTHW };
enum { OUT_UINT8, OUT_FLOAT32, OUT_BFLOAT16 };
/* Most channels an image may have here; decoded images have 1, 3 or 4. */
enum { MAX_CHANNELS = SF_IMAGE_MAX_CHANNELS };

typedef struct augment {
  /* options */
  sf_name_list fields;
  int crop;
  int64_t size;
  int64_t padding;
  sf_float_list scale;
  sf_float_list ratio;
  int64_t resize;
  double flip;
  sf_float_list mean;
  sf_float_list std;
  int layout;
  int dtype;
  bool dct_scaling;
  bool exact;             /* option: false = DCT scaling, fast IDCT and plain upsampling for deferred JPEGs */
  /* from init */
  char names[SF_MAX_FIELDS][SF_FIELD_NAME_MAX];
  int n_names;            /* 0: every decoded uint8 [H,W,C] field */
  double log_ratio[2];
  sf_buffer *luts;        /* sf_image_tables_new's, shared with every field this node deferred */
} augment;

static const char *const crop_names[] = {"none", "random", "center", "random_resized", NULL};
static const char *const layout_names[] = {"hwc", "chw", "thwc", "tchw", "cthw", NULL};
static const char *const dtype_names[] = {"uint8", "float32", "bfloat16", NULL};

static const sf_option options[] = {
    {"fields", SF_OPT_NAME_LIST, offsetof(augment, fields), "", 0, 0,
     "comma-separated image fields to transform (\"\" = every decoded uint8 [H,W,C] image and uint8 [T,H,W,C] "
     "clip (the video plugin's), and a uint16 one from decode's depth 16 is an error record; a listed "
     "field missing from a sample is an error); all fields of a sample get the same random draws, so "
     "an image and its mask stay aligned, and every frame of a clip gets the same crop and flip",
     NULL},
    {"crop", SF_OPT_ENUM, offsetof(augment, crop), "none", 0, 0,
     "crop: none, random (torchvision RandomCrop with padding), center (CenterCrop, zero-pads a "
     "small image) or random_resized (RandomResizedCrop: box from scale and ratio, resampled to size x "
     "size, PIL's antialiased bilinear as torchvision's default)",
     crop_names},
    {"size", SF_OPT_INT, offsetof(augment, size), "0", 0, 65536,
     "output side length in pixels for crops (0 = keep the image's height and width)", NULL},
    {"padding", SF_OPT_INT, offsetof(augment, padding), "0", 0, 65536,
     "zero pixels added on every side before a random or center crop (not materialised)", NULL},
    {"scale", SF_OPT_FLOAT_LIST, offsetof(augment, scale), "0.08,1.0", 0, 0,
     "random_resized: range of the crop's area as a fraction of the image (min,max)", NULL},
    {"ratio", SF_OPT_FLOAT_LIST, offsetof(augment, ratio), "0.75,1.3333333", 0, 0,
     "random_resized: range of the crop's width/height aspect ratio (min,max), drawn log-uniform",
     NULL},
    {"resize", SF_OPT_INT, offsetof(augment, resize), "0", 0, 65536,
     "resize so the shorter side has this many pixels, keeping the aspect ratio, before cropping "
     "(0 = off); antialiased bilinear exactly as PIL's Image.resize(BILINEAR), torchvision's default",
     NULL},
    {"flip", SF_OPT_FLOAT, offsetof(augment, flip), "0", 0, 1,
     "probability of a horizontal flip (0..1)", NULL},
    {"mean", SF_OPT_FLOAT_LIST, offsetof(augment, mean), "", 0, 0,
     "per-channel mean subtracted after scaling to 0..1 (empty = no normalisation)", NULL},
    {"std", SF_OPT_FLOAT_LIST, offsetof(augment, std), "", 0, 0,
     "per-channel standard deviation divided by after subtracting mean (same length as mean)", NULL},
    {"layout", SF_OPT_ENUM, offsetof(augment, layout), "chw", 0, 0,
     "output layout: hwc ([H,W,C]) or chw ([C,H,W]); a clip gets [T,H,W,C] or [T,C,H,W] from these, and thwc "
     "([T,H,W,C]), tchw ([T,C,H,W]) or cthw ([C,T,H,W]) name a clip's axes (an image then gets hwc, chw, chw)",
     layout_names},
    {"dtype", SF_OPT_ENUM, offsetof(augment, dtype), "float32", 0, 0,
     "output type: uint8 (pixel values kept), float32 (x/255, then normalised) or bfloat16 (the "
     "float32 rounded to nearest even)",
     dtype_names},
    {"exact", SF_OPT_BOOL, offsetof(augment, exact), "true", 0, 0,
     "true: a JPEG decode left undecoded gets the full decode's pixels (PIL's, bit for bit); false: its crop "
     "is decoded at the smallest DCT scale that covers the output (dct_scaling), with libjpeg's fast integer "
     "IDCT: less CPU, pixels a few levels off (docs/data.md says how far, and what it did to a model's "
     "accuracy); train and evaluate with the same setting",
     NULL},
    {"dct_scaling", SF_OPT_BOOL, offsetof(augment, dct_scaling), "false", 0, 0,
     "for a JPEG decode left undecoded (its defer_jpeg): false decodes the crop's region at full size, so "
     "pixels equal the full decode's (PIL's) bit for bit; true decodes it at the smallest DCT scale (1/8, "
     "1/4, 1/2, 1) that still covers the output: less CPU on large photos, pixels no longer PIL's",
     NULL},
    {NULL},
};

/* Copies `fields` into names: at most 16 names of at most 31 bytes. */
static int parse_fields(sf_node *node, augment *a) {
  for (int i = 0; i < a->fields.n; i++) {
    if (strlen(a->fields.v[i]) >= SF_FIELD_NAME_MAX || i >= SF_MAX_FIELDS)
      return sf_node_option_error(node, "fields", "lists too many or too long names (at most %d names of at most "
                                                  "%d characters)", SF_MAX_FIELDS, SF_FIELD_NAME_MAX - 1);
    snprintf(a->names[i], sizeof a->names[i], "%s", a->fields.v[i]);
  }
  a->n_names = a->fields.n;
  return 0;
}

static int init(sf_node *node) {
  augment *a = sf_node_priv(node);
  int r = parse_fields(node, a);
  if (r < 0) return r;
  if (a->mean.n != a->std.n)
    return sf_node_option_error(node, NULL, "mean and std must have the same length (one value per channel)");
  for (int i = 0; i < a->std.n; i++)
    if (!(a->std.v[i] > 0))
      return sf_node_option_error(node, NULL, "std values must be positive");
  /* decode gives 1 (gray), 3 (rgb) or 4 (keep, with alpha) channels: another count matches no image. */
  if (a->mean.n && a->mean.n != 1 && a->mean.n != 3 && a->mean.n != 4)
    return sf_node_option_error(node, NULL, "mean and std have %d values, but decoded images have 1 (gray), 3 "
                                            "(rgb) or 4 (rgba) channels: give one value per channel", a->mean.n);
  if (a->mean.n > 0 && a->dtype == OUT_UINT8)
    return sf_node_option_error(node, NULL, "mean/std need a float output: use dtype float32 or bfloat16, "
                                            "or drop mean and std for dtype uint8");
  if (a->crop == CROP_RANDOM_RESIZED) {
    if (a->scale.n != 2 || !(a->scale.v[0] > 0) || a->scale.v[0] > a->scale.v[1])
      return sf_node_option_error(node, NULL, "scale must be two area fractions min,max with 0 < min <= max, "
                                              "e.g. 0.08,1.0");
    if (a->ratio.n != 2 || !(a->ratio.v[0] > 0) || a->ratio.v[0] > a->ratio.v[1])
      return sf_node_option_error(node, NULL, "ratio must be two aspect ratios min,max with 0 < min <= "
                                              "max, e.g. 0.75,1.3333333");
    if (a->padding > 0)
      return sf_node_option_error(node, NULL, "padding applies to crop random or center, not "
                                              "random_resized; set padding 0");
    a->log_ratio[0] = log(a->ratio.v[0]);
    a->log_ratio[1] = log(a->ratio.v[1]);
  }
  /* x/255, then (x - mean)/std, in double and rounded once: the transform's tables. */
  return sf_image_tables_new(a->mean.v, a->std.v, a->mean.n, &a->luts); /* the values init checked above */
}

static void uninit(sf_node *node) {
  augment *a = sf_node_priv(node);
  sf_buffer_unref(&a->luts);
}

/* ---- geometry: where every output pixel comes from ------------------------------------ */

/* Python's round(): half to even, as torchvision's crop arithmetic uses it. */
static int64_t round_half_even(double v) { return (int64_t)nearbyint(v); }

/* torchvision CenterCrop offset within a (padded) extent, negative when it zero-pads. */
static int64_t center_offset(int64_t extent, int64_t n) {
  if (extent >= n) return round_half_even((double)(extent - n) / 2.0);
  return -((n - extent) / 2);
}

/* Shorter side to `target`, the longer truncated as torchvision Resize(int) does. */
static void resized_dims(int64_t h, int64_t w, int64_t target, int64_t *rh, int64_t *rw) {
  if (w <= h) {
    *rw = target;
    *rh = (int64_t)((double)(target * h) / (double)w);
  } else {
    *rh = target;
    *rw = (int64_t)((double)(target * w) / (double)h);
  }
}

/* RandomResizedCrop.get_params: top, left, height, width of the box. */
static void random_resized_box(const augment *a, sf_rng *rng, int64_t h, int64_t w, int64_t box[4]) {
  double area = (double)h * (double)w;
  for (int attempt = 0; attempt < 10; attempt++) {
    double target = area * (a->scale.v[0] + (a->scale.v[1] - a->scale.v[0]) * sf_rng_double(rng));
    double aspect = exp(a->log_ratio[0] + (a->log_ratio[1] - a->log_ratio[0]) * sf_rng_double(rng));
    int64_t bw = round_half_even(sqrt(target * aspect));
    int64_t bh = round_half_even(sqrt(target / aspect));
    if (bw > 0 && bw <= w && bh > 0 && bh <= h) {
      box[0] = (int64_t)sf_rng_below(rng, (uint64_t)(h - bh + 1));
      box[1] = (int64_t)sf_rng_below(rng, (uint64_t)(w - bw + 1));
      box[2] = bh;
      box[3] = bw;
      return;
    }
  }
  double in_ratio = (double)w / (double)h;
  int64_t bh = h, bw = w;
  if (in_ratio < a->ratio.v[0])
    bh = round_half_even((double)w / a->ratio.v[0]);
  else if (in_ratio > a->ratio.v[1])
    bw = round_half_even((double)h * a->ratio.v[1]);
  if (bh < 1) bh = 1;
  if (bh > h) bh = h;
  if (bw < 1) bw = 1;
  if (bw > w) bw = w;
  box[0] = (h - bh) / 2;
  box[1] = (w - bw) / 2;
  box[2] = bh;
  box[3] = bw;
}

/* ---- per field ----------------------------------------------------------------------------- */

/* A decoded uint8 [H,W,C] image, possibly deferred (another augment's output). */
static bool is_image(const sf_field *f) {
  return !f->encoded && f->tensor.dtype == SF_DTYPE_UINT8 && f->tensor.ndim == 3 &&
         (f->tensor.buffer || f->recipe);
}

/* A decoded uint16 [H,W,C] image (decode's depth 16 or native): refused with a record, not passed
   through untransformed next to transformed uint8 ones (one sample uncropped in a batch of crops). */
static bool is_uint16_image(const sf_field *f) {
  return !f->encoded && f->tensor.dtype == SF_DTYPE_UINT16 && f->tensor.ndim == 3 && (f->tensor.buffer || f->recipe);
}

/* A decoded uint8 [T,H,W,C] clip (the video plugin's output). */
static bool is_clip(const sf_field *f) {
  return !f->encoded && f->tensor.dtype == SF_DTYPE_UINT8 && f->tensor.ndim == 4 && (f->tensor.buffer || f->recipe);
}

static bool selected(const augment *a, const sf_field *f) {
  if (a->n_names == 0) return is_image(f) || is_uint16_image(f) || is_clip(f);
  for (int i = 0; i < a->n_names; i++)
    if (strcmp(a->names[i], f->name) == 0) return true;
  return false;
}

typedef struct field_error {
  int code;
  char message[256];
} field_error;

#define FAIL(e, c, ...) (snprintf((e)->message, sizeof (e)->message, __VA_ARGS__), (e)->code = (c))

/* ---- JPEG region decode (decode's defer_jpeg) ------------------------------------------------ */

/* A box edge at DCT scale m/8, rounded to the nearest pixel, at most limit. */
static int64_t scaled_edge(int64_t v, int m, int64_t limit) {
  int64_t s = (v * m + 4) / 8;
  return s < limit ? s : limit;
}

/* r from the codec: a corrupt JPEG (err) becomes the field's error; 0 and SF_ENOMEM pass. */
static int field_result(int r, const sf_error *err, const sf_field *f, field_error *e) {
  if (r == SF_ENOMEM || r == 0) return r;
  return FAIL(e, r, "field '%s': %.200s", f->name, err->message);
}

/*
 * A deferred JPEG this augment does not crop (not in its `fields`, or `crop: none` without `resize`): decoded
 * whole here, with the full decode's pixels, so that a corrupt one is this stage's error record, not black
 * pixels where the batch writes it (the promise of SF_STAGE_TAKES_DEFERRED). Other fields: untouched.
 */
static int decode_whole(sf_field *f, field_error *e) {
  sf_error err = {.code = 0};
  return field_result(sf_image_decode_deferred(f, &err), &err, f, e);
}

/* Returns 0 when f is a uint8 [H,W,C] image augment can transform with a's mean/std, else the data error. */
static int check_image(const augment *a, const sf_field *f, field_error *e) {
  const sf_tensor *in = &f->tensor;
  if (is_uint16_image(f))
    return FAIL(e, SF_EINVAL, "field '%s' is a uint16 image (decode's depth 16 or native); augment transforms "
                "uint8 images only: set decode's `depth: 8`, or leave the field out of augment's `fields`",
                f->name);
  if (!is_image(f))
    return FAIL(e, SF_ESHAPE, "field '%s' is not a decoded uint8 [H,W,C] image or [T,H,W,C] clip (%s, %d "
                "dimensions%s); decode it first or leave it out of `fields`", f->name, sf_dtype_name(in->dtype), in->ndim,
                f->encoded ? ", still encoded" : "");
  int64_t h = in->shape[0], w = in->shape[1], c = in->shape[2];
  if (h < 1 || w < 1 || c < 1 || c > MAX_CHANNELS)
    return FAIL(e, SF_ESHAPE, "field '%s' has shape [%lld,%lld,%lld]; augment needs a non-empty image "
                "with 1..%d channels", f->name, (long long)h, (long long)w, (long long)c, MAX_CHANNELS);
  if (a->mean.n && a->mean.n != c)
    return FAIL(e, SF_ESHAPE, "field '%s' has %lld channels but mean/std give %d values; give one value "
                "per channel", f->name, (long long)c, a->mean.n);
  return 0;
}

/* The layout of one image or one frame of a clip: hwc and thwc keep channels last, the others put them first. */
static int frame_layout(const augment *a) {
  return a->layout == LAYOUT_HWC || a->layout == LAYOUT_THWC ? SF_IMAGE_HWC : SF_IMAGE_CHW;
}

/* The sizes a field's plan is made of: the source (h, w), after `resize` (rh, rw) and out (oh, ow). */
typedef struct geometry {
  int64_t h, w, rh, rw, oh, ow;
  bool jpeg; /* the source is a JPEG left undecoded: a random resized crop's axes are at its DCT scale */
} geometry;

/*
 * The sizes every plan starts from: g's resize of its h x w (the shorter side to `resize`; an identity resize
 * stays on the direct path), the output size, and t's axes for the resize alone. Fails on a resize to nothing.
 */
static int size_plan(const augment *a, const sf_field *f, geometry *g, sf_image_transform *t, field_error *e) {
  const int64_t h = g->h, w = g->w;
  if (a->resize > 0) resized_dims(h, w, a->resize, &g->rh, &g->rw);
  if (g->rh < 1 || g->rw < 1)
    return FAIL(e, SF_ESHAPE, "field '%s' of %lldx%lld pixels would resize to %lldx%lld; use a larger "
                "`resize`", f->name, (long long)h, (long long)w, (long long)g->rh, (long long)g->rw);
  g->oh = a->size ? a->size : g->rh, g->ow = a->size ? a->size : g->rw;
  t->y = (sf_image_axis){0, h, g->rh, 0, g->rh}, t->x = (sf_image_axis){0, w, g->rw, 0, g->rw};
  return 0;
}

/*
 * A random resized crop's box, in t's source (a JPEG at DCT scale t->m, whose rect is the box's pixels, when
 * g->jpeg is set).
 */
static void plan_random_resized(const augment *a, sf_rng *rng, const geometry *g, sf_image_transform *t) {
  int64_t box[4];
  random_resized_box(a, rng, g->h, g->w, box);
  if (!g->jpeg) {
    t->y = (sf_image_axis){box[0], box[2], g->oh, 0, g->oh};
    t->x = (sf_image_axis){box[1], box[3], g->ow, 0, g->ow};
    return;
  }
  /* The box at the smallest DCT scale that still covers size, its edges rounded to whole pixels. */
  int m = a->dct_scaling || !a->exact ? sf_jpeg_dct_scale(box[2], box[3], g->oh, g->ow) : 8;
  int64_t sh = sf_jpeg_scaled(g->h, m), sw = sf_jpeg_scaled(g->w, m);
  int64_t *rect = t->rect;
  rect[0] = scaled_edge(box[0], m, sh - 1), rect[1] = scaled_edge(box[1], m, sw - 1);
  rect[2] = scaled_edge(box[0] + box[2], m, sh), rect[3] = scaled_edge(box[1] + box[3], m, sw);
  if (rect[2] <= rect[0]) rect[2] = rect[0] + 1;
  if (rect[3] <= rect[1]) rect[3] = rect[1] + 1;
  t->m = m;
  t->y = (sf_image_axis){rect[0], rect[2] - rect[0], g->oh, 0, g->oh};
  t->x = (sf_image_axis){rect[1], rect[3] - rect[1], g->ow, 0, g->ow};
}

/* The crop's window (t->y, t->x already span the resized image) and its random draws. 0 or a data error. */
static int plan_crop(const augment *a, const sf_field *f, sf_rng *rng, const geometry *g, sf_image_transform *t,
                     field_error *e) {
  switch (a->crop) {
  case CROP_RANDOM: {
    int64_t ph = g->rh + 2 * a->padding, pw = g->rw + 2 * a->padding;
    if (ph < g->oh || pw < g->ow)
      return FAIL(e, SF_ESHAPE, "field '%s' is %lldx%lld pixels (with padding %lld) but the random crop "
                  "is %lldx%lld; raise `padding` or `resize`, or lower `size`", f->name, (long long)g->rh,
                  (long long)g->rw, (long long)a->padding, (long long)g->oh, (long long)g->ow);
    t->y.pos = (int64_t)sf_rng_below(rng, (uint64_t)(ph - g->oh + 1)) - a->padding;
    t->x.pos = (int64_t)sf_rng_below(rng, (uint64_t)(pw - g->ow + 1)) - a->padding;
    t->y.n = g->oh;
    t->x.n = g->ow;
    return 0;
  }
  case CROP_CENTER:
    t->y.pos = center_offset(g->rh + 2 * a->padding, g->oh) - a->padding;
    t->x.pos = center_offset(g->rw + 2 * a->padding, g->ow) - a->padding;
    t->y.n = g->oh;
    t->x.n = g->ow;
    return 0;
  case CROP_RANDOM_RESIZED: plan_random_resized(a, rng, g, t); return 0;
  default: return 0;
  }
}

/*
 * Transforms one field in place of its tensor. rng is this sample's stream,
 * restarted for every field so same-sized fields get the same crop and flip.
 * The random draws and the geometry happen here, into a plan (sf_image_transform);
 * the codec applies it, usually deferring its last pass: batch writes it
 * straight into its slot, saving an allocation and a copy.
 * Returns 0, SF_ENOMEM, or a data error with *e filled.
 */
static int transform(sf_node *node, const augment *a, sf_field *f, uint64_t stream, bool *borrow, uint64_t *bytes,
                     field_error *e) {
  int r = check_image(a, f, e);
  if (r < 0) return r;
  const sf_tensor *in = &f->tensor;
  int64_t h = in->shape[0], w = in->shape[1], c = in->shape[2];
  /* A JPEG that decode left undecoded (defer_jpeg): decode only what the crop or resize reads. */
  bool regional = a->crop == CROP_RANDOM_RESIZED ? a->resize == 0 : a->crop != CROP_NONE || a->resize > 0;
  const bool jpeg = regional && sf_image_is_deferred_jpeg(f);
  r = jpeg ? 0 : decode_whole(f, e);
  if (r == 0 && !jpeg) r = sf_field_materialize(f); /* a deferred input: an earlier augment's output */
  if (r < 0) return r;

  sf_rng rng;
  sf_rng_seed(&rng, stream);
  static const sf_dtype out_dtype[] = {SF_DTYPE_UINT8, SF_DTYPE_FLOAT32, SF_DTYPE_BFLOAT16};
  sf_image_transform t = {.tables = a->luts, .dtype = out_dtype[a->dtype], .layout = frame_layout(a),
                          .channels = (int)c};
  geometry g = {.h = h, .w = w, .rh = h, .rw = w, .jpeg = jpeg};
  if (size_plan(a, f, &g, &t, e) < 0) return e->code;

  sf_tensor resized = {0}; /* the source when a random resized crop follows a resize (else the field itself) */
  if (a->crop == CROP_RANDOM_RESIZED && (g.rh != h || g.rw != w)) {
    /* A box of the resized image is resampled again: materialise the resize (uint8, as torchvision). */
    if ((r = sf_image_resize(in, g.rh, g.rw, &resized)) < 0) return r;
    g.h = g.rh, g.w = g.rw;
  }
  r = plan_crop(a, f, &rng, &g, &t, e);
  if (r < 0) {
    sf_tensor_clear(&resized);
    return r;
  }
  t.flip = a->flip > 0 && sf_rng_double(&rng) < a->flip;
  if (jpeg && a->crop != CROP_RANDOM_RESIZED) {
    /*
     * Resize from the smallest DCT scale that still covers it: the image at that scale is the
     * source, of which only the rows and columns the window's resize reads are decoded.
     */
    t.m = a->resize > 0 && (a->dct_scaling || !a->exact) ? sf_jpeg_dct_scale(h, w, g.rh, g.rw) : 8;
    t.y.span = sf_jpeg_scaled(h, t.m);
    t.x.span = sf_jpeg_scaled(w, t.m);
    sf_image_axis_reads(&t.y, &t.rect[0], &t.rect[2]);
    sf_image_axis_reads(&t.x, &t.rect[1], &t.rect[3]);
  }
  t.fast = !a->exact;
  int64_t shape[3];
  sf_image_transform_shape(&t, shape);
  *bytes += (size_t)(shape[0] * shape[1] * shape[2]) * sf_dtype_size(t.dtype);
  /* A row the consumer lends (batch's), for one field of the sample: the whole transform is written there now. */
  sf_tensor row = {0};
  const bool lent = *borrow && sf_node_borrow_row(node, t.dtype, 3, shape, &row) == 1;
  if (lent) *borrow = false;
  sf_error err = {.code = 0};
  const sf_tensor *src = resized.buffer ? &resized : NULL;
  r = lent ? sf_image_transform_apply_into(f, &t, src, &row, &err) : sf_image_transform_apply(f, &t, src, &err);
  r = field_result(r, &err, f, e);
  sf_tensor_clear(&resized);
  return r;
}

/*
 * Transforms a uint8 [T,H,W,C] clip: one plan (one set of random draws from the sample's stream, as an image of the
 * clip's frame size gets) applied to every frame, into a new [T,...] or [C,T,H,W] tensor that replaces the field.
 * Eager, not deferred as images are: a deferred transform (sf_image_transform_apply) holds one image's source and a 3-D
 * output, and a deferred clip would keep the whole decoded clip (T frames at the video's size) alive in the shuffle
 * and batch queues where the usually much smaller crop is all that is needed; the copy batch then makes is small
 * next to decoding the video. Returns 0, SF_ENOMEM, or a data error with *e filled.
 */
static int transform_clip(const augment *a, sf_field *f, uint64_t stream, uint64_t *bytes, field_error *e) {
  int r = sf_field_materialize(f); /* a plugin's deferred clip */
  if (r < 0) return r;
  const sf_tensor *in = &f->tensor;
  int64_t n = in->shape[0], h = in->shape[1], w = in->shape[2], c = in->shape[3];
  if (n < 1 || h < 1 || w < 1 || c < 1 || c > MAX_CHANNELS)
    return FAIL(e, SF_ESHAPE, "field '%s' has shape [%lld,%lld,%lld,%lld]; augment needs a clip of at least one "
                "non-empty frame with 1..%d channels", f->name, (long long)n, (long long)h, (long long)w,
                (long long)c, MAX_CHANNELS);
  if (a->mean.n && a->mean.n != c)
    return FAIL(e, SF_ESHAPE, "field '%s' has %lld channels but mean/std give %d values; give one value "
                "per channel", f->name, (long long)c, a->mean.n);

  /* The plan, exactly as transform() makes it for one frame-sized image (no JPEG here). */
  sf_rng rng;
  sf_rng_seed(&rng, stream);
  static const sf_dtype out_dtype[] = {SF_DTYPE_UINT8, SF_DTYPE_FLOAT32, SF_DTYPE_BFLOAT16};
  sf_image_transform t = {.tables = a->luts, .dtype = out_dtype[a->dtype], .layout = frame_layout(a),
                          .channels = (int)c, .fast = !a->exact};
  geometry g = {.h = h, .w = w, .rh = h, .rw = w};
  if (size_plan(a, f, &g, &t, e) < 0) return e->code;
  /* A random resized crop after a resize crops each frame's materialised resize (as images: uint8, torchvision). */
  bool resize_first = a->crop == CROP_RANDOM_RESIZED && (g.rh != h || g.rw != w);
  if (resize_first) g.h = g.rh, g.w = g.rw;
  if ((r = plan_crop(a, f, &rng, &g, &t, e)) < 0) return r;
  t.flip = a->flip > 0 && sf_rng_double(&rng) < a->flip;

  int64_t frame[3];
  sf_image_transform_shape(&t, frame);
  size_t plane = (size_t)(t.y.n * t.x.n) * sf_dtype_size(t.dtype), frame_bytes = plane * (size_t)c;
  int64_t shape[4] = {n, frame[0], frame[1], frame[2]};
  if (a->layout == LAYOUT_CTHW) shape[0] = c, shape[1] = n;
  sf_tensor out;
  if ((r = sf_tensor_alloc(&out, t.dtype, 4, shape)) < 0) return r;
  /* cthw: each frame is written as [C,H,W] into scratch, its planes then go to their places in [C,T,H,W]. */
  uint8_t *scratch = a->layout == LAYOUT_CTHW ? malloc(frame_bytes) : NULL;
  if (a->layout == LAYOUT_CTHW && !scratch) {
    sf_tensor_clear(&out);
    return SF_ENOMEM;
  }
  uint8_t *dst = sf_tensor_data(&out);
  for (int64_t k = 0; k < n && r == 0; k++) {
    /* Frame k as a uint8 [H,W,C] view of the clip (borrowed: the field keeps the buffer alive). */
    sf_tensor view = {.dtype = SF_DTYPE_UINT8, .ndim = 3, .shape = {h, w, c},
                      .strides = {in->strides[1], in->strides[2], in->strides[3]},
                      .offset = (size_t)((int64_t)in->offset + k * in->strides[0]), .buffer = in->buffer};
    sf_tensor resized = {0};
    if (resize_first && (r = sf_image_resize(&view, g.rh, g.rw, &resized)) < 0) break;
    uint8_t *to = scratch ? scratch : dst + (size_t)k * frame_bytes;
    r = sf_image_transform_write(&t, resize_first ? &resized : &view, to, NULL); /* fails only out of memory */
    sf_tensor_clear(&resized);
    if (r == 0 && scratch)
      for (int64_t ch = 0; ch < c; ch++)
        memcpy(dst + ((size_t)ch * (size_t)n + (size_t)k) * plane, scratch + (size_t)ch * plane, plane);
  }
  free(scratch);
  if (r < 0) {
    sf_tensor_clear(&out);
    return r;
  }
  *bytes += sf_tensor_nbytes(&out);
  sf_tensor_clear(&f->tensor);
  f->tensor = out;
  return 0;
}

static int map(sf_node *node, sf_sample **ps) {
  augment *a = sf_node_priv(node);
  sf_sample *s = *ps;
  uint64_t stream = sf_node_seed(node);
  stream = sf_seed_mix(stream, s->epoch);
  stream = sf_seed_mix(stream, s->pass);
  stream = sf_seed_mix(stream, s->shard_index);
  stream = sf_seed_mix(stream, s->index);

  uint64_t bytes = 0;
  bool borrow = true; /* a lent row for the first image field */
  field_error e = {0};
  for (int i = 0; i < a->n_names && !e.code; i++)
    if (!sf_sample_field(s, a->names[i]))
      FAIL(&e, SF_ENOENT, "sample has no field '%s' listed in augment's `fields`", a->names[i]);
  for (int i = 0; i < s->n_fields && !e.code; i++) {
    sf_field *f = &s->fields[i];
    int r = !selected(a, f) ? decode_whole(f, &e)
            : is_clip(f)    ? transform_clip(a, f, stream, &bytes, &e)
                            : transform(node, a, f, stream, &borrow, &bytes, &e);
    if (r < 0 && !e.code) return r; /* out of memory: not the sample's fault, so no record; the pipeline stops */
  }
  if (e.code) {
    sf_node_error(node, e.code, sf_sample_url(s), s->key, s->offset, "%s", e.message);
    return e.code;
  }
  return 0;
}

const sf_stage_def sf_stage_augment = {
    .abi_version = SF_STAGE_ABI_VERSION,
    .name = "augment",
    .summary = "resize, crop (padded random, center, random resized), flip, normalize, HWC/CHW and "
               "dtype in one pass over the output; clips [T,H,W,C] get one draw for every frame",
    .inputs = SF_PORTS({"in", SF_PORT_SAMPLE}),
    .outputs = SF_PORTS({"out", SF_PORT_SAMPLE}),
    .flags = SF_STAGE_MAP | SF_STAGE_TAKES_DEFERRED | SF_STAGE_BORROWS_ROWS,
    .priv_size = sizeof(augment),
    .options = options,
    .init = init,
    .map = map,
    .uninit = uninit,
};
