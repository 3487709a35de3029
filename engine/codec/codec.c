/*
 * The public codec API (include/shardflow/codec.h) over the lazy module: a public sf_image_transform becomes
 * the internal description (lazy.h) with its source, JPEG and tables filled in, after the checks a caller
 * outside the engine needs (a plugin's plan must not make the kernels read outside the image).
 */
#include <stdio.h>
#include <string.h>

#include "lazy.h"

/* ---- JPEGs left undecoded ----------------------------------------------------------------------- */

int sf_image_defer_jpeg(sf_field *f, sf_image_mode mode, const sf_image_limits *limits) {
  return sf_lazy_defer_jpeg(f, mode, limits);
}

bool sf_image_is_deferred_jpeg(const sf_field *f) { return sf_lazy_jpeg_of(f) != NULL; }

int sf_image_decode_deferred(sf_field *f, sf_error *error) { return sf_lazy_decode_jpeg(f, error); }

/* ---- the transform ------------------------------------------------------------------------------ */

void sf_image_axis_reads(const sf_image_axis *a, int64_t *first, int64_t *end) { sf_lazy_reads(a, first, end); }

int sf_image_tables_new(const double *mean, const double *std, int n, sf_buffer **out) {
  *out = NULL;
  if (n < 0 || n > SF_IMAGE_MAX_NORM_CHANNELS || (n > 0 && (!mean || !std))) return SF_EINVAL;
  for (int c = 0; c < n; c++)
    if (!(std[c] > 0)) return SF_EINVAL;
  *out = sf_lazy_tables_new(mean, std, n);
  return *out ? 0 : SF_ENOMEM;
}

const void *sf_image_tables_values(const sf_buffer *tables, sf_dtype dtype, int channel) {
  if (!tables || sf_buffer_size(tables) != sizeof(sf_lazy_tables) || channel < 0) return NULL;
  const sf_lazy_tables *l = (const sf_lazy_tables *)sf_buffer_data(tables);
  if (l->n && channel >= l->n) return NULL;
  int c = l->n ? channel : 0;
  return dtype == SF_DTYPE_UINT8      ? (const void *)l->u8
         : dtype == SF_DTYPE_FLOAT32  ? (const void *)l->f32[c]
         : dtype == SF_DTYPE_BFLOAT16 ? (const void *)l->bf16[c]
                                      : NULL;
}

void sf_image_transform_shape(const sf_image_transform *t, int64_t shape[3]) {
  sf_lazy_transform l = {.y = t->y, .x = t->x, .layout = (int)t->layout, .channels = t->channels};
  sf_lazy_shape(&l, shape);
}

/* 0 when axis a fits a source extent of `extent` pixels, else SF_EINVAL with *error naming it. */
static int check_axis(const sf_image_axis *a, const char *name, int64_t extent, sf_error *error) {
  if (a->span >= 1 && a->scaled >= 1 && a->n >= 1 && a->origin >= 0 && a->origin <= extent - a->span &&
      a->scaled <= INT32_MAX && a->n <= INT32_MAX && a->pos > -INT32_MAX && a->pos < INT32_MAX)
    return 0;
  return sf_error_set(error, SF_EINVAL, SF_NOWHERE,
                      "image transform: axis %s {origin %lld, span %lld, scaled %lld, pos %lld, n %lld} does not fit "
                      "a source of %lld pixels (needs span, scaled, n >= 1 and [origin, origin+span) inside it)",
                      name, (long long)a->origin, (long long)a->span, (long long)a->scaled, (long long)a->pos,
                      (long long)a->n, (long long)extent);
}

/* The checks of t that need no source: dtype, layout, channels, tables. 0 or SF_EINVAL. */
static int check_plan(const sf_image_transform *t, sf_error *error) {
  if (t->dtype != SF_DTYPE_UINT8 && t->dtype != SF_DTYPE_FLOAT32 && t->dtype != SF_DTYPE_BFLOAT16)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: output dtype %s is not uint8, float32 or "
                        "bfloat16", sf_dtype_name(t->dtype));
  if (t->layout != SF_IMAGE_HWC && t->layout != SF_IMAGE_CHW)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: layout %d is not SF_IMAGE_HWC or "
                        "SF_IMAGE_CHW", (int)t->layout);
  if (t->channels < 1 || t->channels > SF_IMAGE_MAX_CHANNELS)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: %d channels (1..%d)", t->channels,
                        SF_IMAGE_MAX_CHANNELS);
  if (!t->tables || sf_buffer_size(t->tables) != sizeof(sf_lazy_tables))
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: tables is not a buffer made by "
                        "sf_image_tables_new");
  int n = ((const sf_lazy_tables *)sf_buffer_data(t->tables))->n;
  if (n && n != t->channels)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: %d channels but the tables hold a mean "
                        "and std for %d", t->channels, n);
  return 0;
}

/* 0 when src is a uint8 [H, W, channels] image t's axes fit, else SF_EINVAL. */
static int check_view(const sf_image_transform *t, const sf_tensor *src, sf_error *error) {
  if (src->dtype != SF_DTYPE_UINT8 || src->ndim != 3 || !src->buffer || src->shape[2] != t->channels)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: the source is not a uint8 [H,W,%d] image "
                        "(%s, %d dimensions)", t->channels, sf_dtype_name(src->dtype), src->ndim);
  int r = check_axis(&t->y, "y", src->shape[0], error);
  return r < 0 ? r : check_axis(&t->x, "x", src->shape[1], error);
}

/* 0 when t's m, rect and axes fit the JPEG jpeg (the axes read only inside rect), else SF_EINVAL. */
static int check_jpeg(const sf_image_transform *t, const sf_jpeg_source *jpeg, sf_error *error) {
  if (t->m != 1 && t->m != 2 && t->m != 4 && t->m != 8)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: DCT scale m %d is not 1, 2, 4 or 8", t->m);
  if (jpeg->channels != t->channels)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: %d channels but the JPEG decodes to %d",
                        t->channels, jpeg->channels);
  const int64_t h = sf_jpeg_scaled(jpeg->height, t->m), w = sf_jpeg_scaled(jpeg->width, t->m);
  const int64_t *rect = t->rect;
  if (!(0 <= rect[0] && rect[0] < rect[2] && rect[2] <= h && 0 <= rect[1] && rect[1] < rect[3] && rect[3] <= w))
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: rect [%lld,%lld,%lld,%lld] is not a "
                        "non-empty rectangle of the %lldx%lld image at scale %d/8", (long long)rect[0],
                        (long long)rect[1], (long long)rect[2], (long long)rect[3], (long long)h, (long long)w, t->m);
  int r = check_axis(&t->y, "y", h, error);
  if (r == 0) r = check_axis(&t->x, "x", w, error);
  if (r < 0) return r;
  int64_t y0, y1, x0, x1;
  sf_lazy_reads(&t->y, &y0, &y1);
  sf_lazy_reads(&t->x, &x0, &x1);
  if (y0 < rect[0] || y1 > rect[2] || x0 < rect[1] || x1 > rect[3])
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: the axes read rows [%lld,%lld) and "
                        "columns [%lld,%lld), outside rect [%lld,%lld,%lld,%lld] (sf_image_axis_reads)",
                        (long long)y0, (long long)y1, (long long)x0, (long long)x1, (long long)rect[0],
                        (long long)rect[1], (long long)rect[2], (long long)rect[3]);
  return 0;
}

/* The internal description of t (its source, JPEG and clock unset). */
static sf_lazy_transform internal_of(const sf_image_transform *t) {
  return (sf_lazy_transform){.m = t->m, .fast = t->fast, .y = t->y, .x = t->x, .flip = t->flip,
                             .tables = t->tables, .dtype = t->dtype, .layout = (int)t->layout,
                             .channels = t->channels, .rect = {t->rect[0], t->rect[1], t->rect[2], t->rect[3]}};
}

int sf_image_transform_write(const sf_image_transform *t, const sf_tensor *src, void *dst, sf_error *error) {
  sf_error scratch = {.code = 0};
  if (!error) error = &scratch;
  int r = check_plan(t, error);
  if (r == 0) r = check_view(t, src, error);
  if (r < 0) return r;
  sf_lazy_transform l = internal_of(t);
  l.src = *src;
  return sf_lazy_write(&l, dst, error);
}

/* Checks that into is a C-contiguous view of t's output shape and dtype: 0, or SF_EINVAL in *error. */
static int check_into(const sf_image_transform *t, const sf_tensor *into, sf_error *error) {
  int64_t shape[3];
  sf_image_transform_shape(t, shape);
  bool fits = into->buffer && into->dtype == t->dtype && into->ndim == 3 && sf_tensor_is_contiguous(into) &&
              memcmp(into->shape, shape, sizeof shape) == 0;
  return fits ? 0 : sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: the row to write into is not a "
                                 "contiguous tensor of the output's shape and dtype");
}

int sf_image_transform_apply(sf_field *f, const sf_image_transform *t, const sf_tensor *src, sf_error *error) {
  return sf_image_transform_apply_into(f, t, src, NULL, error);
}

/* Points l at t's source, after checking that t fits it: f's undecoded JPEG, else src, else f's own tensor. */
static int set_source(sf_lazy_transform *l, const sf_image_transform *t, const sf_field *f, const sf_tensor *src,
                      sf_error *error) {
  const sf_jpeg_source *jpeg = src ? NULL : sf_lazy_jpeg_of(f);
  if (jpeg) {
    l->jpeg = jpeg;
    return check_jpeg(t, jpeg, error);
  }
  if (!src && f->recipe)
    return sf_error_set(error, SF_EINVAL, SF_NOWHERE, "image transform: field '%s' is deferred (not a JPEG left "
                        "undecoded): materialise it first (sf_field_materialize)", f->name);
  l->src = src ? *src : f->tensor;
  return check_view(t, &l->src, error);
}

int sf_image_transform_apply_into(sf_field *f, const sf_image_transform *t, const sf_tensor *src, sf_tensor *into,
                                  sf_error *error) {
  sf_error scratch = {.code = 0};
  if (!error) error = &scratch;
  sf_lazy_transform l = internal_of(t);
  int r = check_plan(t, error);
  if (r == 0 && into) r = check_into(t, into, error);
  if (r == 0) r = set_source(&l, t, f, src, error);
  if (r < 0) {
    if (into) sf_tensor_clear(into);
    return r;
  }
  return sf_lazy_apply(f, &l, into, error);
}

int sf_image_resize(const sf_tensor *src, int64_t h, int64_t w, sf_tensor *out) {
  memset(out, 0, sizeof *out);
  if (src->dtype != SF_DTYPE_UINT8 || src->ndim != 3 || !src->buffer || src->shape[0] < 1 || src->shape[1] < 1 ||
      src->shape[2] < 1 || src->shape[2] > SF_IMAGE_MAX_CHANNELS || h < 1 || w < 1 || h > INT32_MAX || w > INT32_MAX)
    return SF_EINVAL;
  int r = sf_lazy_resize(src, h, w, out);
  if (r < 0 || out->buffer) return r;
  /* The same size: nothing to resample, but the caller still gets a contiguous image of its own. */
  if ((r = sf_tensor_alloc(out, SF_DTYPE_UINT8, 3, src->shape)) < 0) return r;
  sf_tensor_copy_to(src, sf_tensor_data(out));
  return 0;
}

/* ---- deferred fields ---------------------------------------------------------------------------- */

void sf_field_write(const sf_field *f, void *dst) { sf_lazy_write_field(f, dst); }

const void *sf_field_recipe_data(const sf_field *f, size_t *size) {
  const sf_lazy_transform *t = sf_lazy_transform_of(f);
  *size = t ? sizeof *t : 0;
  return t;
}

const void *sf_field_source(const sf_field *f, size_t *size) { return sf_lazy_source(f, size); }
