/*
 * Lazy fields: work on a field left for later, held as data. The one owner of the engine's built-in
 * kinds of deferred field (sf_field_recipe): a JPEG left undecoded (decode's defer_jpeg) and a
 * transform still to apply (augment's crop, resize, flip, normalisation, dtype and layout). Stages,
 * the executor and the group transport ask this module about a field's recipe; none of them knows a
 * recipe's write function. Plugin recipes are opaque here: they are written through their write().
 * Engine-internal: the public sf_field_recipe is unchanged (plugins keep their ABI). Stages and plugins
 * reach these through include/shardflow/codec.h (engine/codec/codec.c), which keeps the descriptions'
 * source, JPEG and clock out of the public sf_image_transform.
 */
#ifndef SF_ENGINE_LAZY_H
#define SF_ENGINE_LAZY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "image.h"
#include "jpeg_region.h"
#include "normalize.h"
#include "shardflow/codec.h"
#include "shardflow/sample.h"

/* ---- the clock: the time a deferred field's write takes, charged to the node that deferred it ---- */

/*
 * Shared by a node and the deferred fields it made, which may outlive it in queues (reference counted,
 * atomic: written on any thread).
 */
typedef struct sf_lazy_clock sf_lazy_clock;

/* A new clock with one reference (the caller's), or NULL when out of memory. */
sf_lazy_clock *sf_lazy_clock_new(void);
/* Takes a reference to clock and returns it. */
sf_lazy_clock *sf_lazy_clock_ref(sf_lazy_clock *clock);
/* Drops a reference (NULL-safe); the last one frees it. */
void sf_lazy_clock_unref(sf_lazy_clock *clock);
/* Adds ns nanoseconds of writing to clock and to this thread's total (sf_lazy_thread_ns). */
void sf_lazy_clock_charge(sf_lazy_clock *clock, uint64_t ns);
/* Nanoseconds charged to clock so far (0 for NULL). */
uint64_t sf_lazy_clock_ns(const sf_lazy_clock *clock);
/* Nanoseconds this thread spent writing deferred fields that have a clock (any node's). */
uint64_t sf_lazy_thread_ns(void);

/* ---- kind 1: a JPEG left undecoded --------------------------------------------------------------- */

/*
 * Makes field f (encoded JPEG bytes in f->tensor) a deferred uint8 [height, width, channels] field
 * holding an sf_jpeg_source, when the region path applies (see sf_jpeg_probe). Its write() decodes the
 * whole image, as sf_image_decode would (the fallback when no crop comes). Returns 1 when deferred,
 * 0 when not (f untouched: decode it as before), SF_ENOMEM.
 */
int sf_lazy_defer_jpeg(sf_field *f, sf_image_mode mode, const sf_image_limits *limits);

/* The field's undecoded JPEG when f was deferred by sf_lazy_defer_jpeg(), else NULL (borrowed). */
const sf_jpeg_source *sf_lazy_jpeg_of(const sf_field *f);

/*
 * Decodes an undecoded JPEG field now, whole, with the full decode's pixels, so that a corrupt one is
 * the caller's error rather than black pixels later. Other fields: untouched, 0. Returns 0, SF_ENOMEM or
 * SF_EFORMAT with libjpeg's message in *error (f then unchanged).
 */
int sf_lazy_decode_jpeg(sf_field *f, sf_error *error);

/* ---- kind 2: a transform still to apply ---------------------------------------------------------- */

/*
 * One axis of the output: the public sf_image_axis (include/shardflow/codec.h). Conceptually a source span
 * [origin, origin+span) is resampled to `scaled` pixels, zero-padded, and the window [pos, pos+n) of that
 * is taken (and mirrored when flipped on the x axis). When scaled == span the axis is a plain copy.
 */
typedef sf_image_axis sf_lazy_axis;

enum { SF_LAZY_HWC = SF_IMAGE_HWC, SF_LAZY_CHW = SF_IMAGE_CHW };
/* Most channels an image may have here; decoded images have 1, 3 or 4. */
enum { SF_LAZY_MAX_CHANNELS = SF_IMAGE_MAX_CHANNELS };

/*
 * Output value of every byte, per channel (only table 0 when n is 0: no mean/std). Immutable once
 * sf_lazy_tables_new has filled it; shared by reference with every field deferred with it.
 */
typedef struct sf_lazy_tables {
  uint8_t u8[256];
  float f32[8][256];
  uint16_t bf16[8][256];
  int n;             /* channels with a mean and std (0: none) */
  /* f32 of channels 0..2 as multiply-adds, when they give every entry (see normalize.h) */
  bool affine;
  sf_normalize rgb;
} sf_lazy_tables;

/*
 * A new buffer holding an sf_lazy_tables: x/255, then (x - mean[c])/std[c] when n > 0 (n <= 8), in
 * double and rounded once. Returns NULL when out of memory (caller owns the buffer).
 */
sf_buffer *sf_lazy_tables_new(const double *mean, const double *std, int n);

/*
 * A transform of one image field as data. The source is a decoded uint8 [H,W,C] view (src), or,
 * when jpeg is set, the rectangle rect (rows rect[0]..rect[2], columns rect[1]..rect[3]) of that JPEG
 * decoded at DCT scale m/8 (fast: libjpeg's fast IDCT and plain upsampling); the axes are then in
 * the pixels of the image at that scale. Everything is borrowed by the description; a deferred field
 * keeps references of its own.
 */
typedef struct sf_lazy_transform {
  sf_tensor src;                /* a view: uint8 [H,W,C] (unused when jpeg is set) */
  const sf_jpeg_source *jpeg;
  int64_t rect[4];
  int m;
  bool fast;
  sf_lazy_axis y, x;
  bool flip;
  sf_buffer *tables;            /* an sf_lazy_tables (sf_lazy_tables_new) */
  sf_dtype dtype;               /* SF_DTYPE_UINT8, _FLOAT32 or _BFLOAT16 */
  int layout;                   /* SF_LAZY_HWC or SF_LAZY_CHW */
  int channels;
  sf_lazy_clock *clock;         /* charged with the write's time when set (the executor sets it) */
} sf_lazy_transform;

/* The output shape of t: [y.n, x.n, channels] (HWC) or [channels, y.n, x.n] (CHW). */
void sf_lazy_shape(const sf_lazy_transform *t, int64_t shape[3]);

/*
 * The materialisation: writes t's output, C-contiguous in sf_lazy_shape's shape, into dst (the
 * caller's: a tensor, a batch row, an shm ring extent, a socket frame). A JPEG source is decoded and a
 * resampling axis resampled first, into scratch; a view is read directly. Returns 0, SF_ENOMEM, or
 * SF_EFORMAT for a corrupt JPEG with libjpeg's message in *error (error may be NULL; dst is then
 * zeros).
 */
int sf_lazy_write(const sf_lazy_transform *t, void *dst, sf_error *error);

/*
 * Applies t to field f (its source: f's own tensor or JPEG): the JPEG region is decoded and any
 * resampling done now (so that a corrupt JPEG is f's error). With `into` (a C-contiguous view of the
 * output's shape and dtype: a row its consumer lent), the last pass is written there now and f's tensor
 * becomes that view (the call takes the caller's reference; on error it is cleared). Otherwise the last
 * pass is deferred (f becomes a deferred field holding the description, written later straight into its
 * destination) unless the source it would keep alive is much larger than the output, when f gets its
 * output tensor now.
 * Returns 0, SF_ENOMEM or SF_EFORMAT (message in *error); f is unchanged on error.
 */
int sf_lazy_apply(sf_field *f, const sf_lazy_transform *t, sf_tensor *into, sf_error *error);

/*
 * Resamples all of the uint8 [H,W,C] view src to h x w (PIL's antialiased bilinear) into *out, a new
 * pooled uint8 [h,w,C] tensor the caller owns. Returns 0 or SF_ENOMEM.
 */
int sf_lazy_resize(const sf_tensor *src, int64_t h, int64_t w, sf_tensor *out);

/*
 * The source pixels [*first, *end) that resampling axis a reads for its output window (what to decode
 * of a JPEG when only that is needed).
 */
void sf_lazy_reads(const sf_lazy_axis *a, int64_t *first, int64_t *end);

/* The field's transform when f was deferred by sf_lazy_apply(), else NULL (borrowed). */
const sf_lazy_transform *sf_lazy_transform_of(const sf_field *f);

/* ---- any field --------------------------------------------------------------------------------- */

/*
 * The executor's hook for a sample a node pushes: when f's recipe is one of this module's kinds, gives
 * a transform without a clock a reference to clock (its writes are then charged there) and returns
 * true; a JPEG is left as it is (its consumer decodes it, on its own time) and also returns true.
 * Returns false for a plugin's recipe (or no recipe): time it some other way.
 */
bool sf_lazy_adopt(sf_field *f, sf_lazy_clock *clock);

/*
 * Where the recipe of f, when one of this module's kinds, reads its source bytes: the first byte, and
 * in *size how many from there (a prefetch hint for a stage holding the sample before its write).
 * NULL (size 0) otherwise.
 */
const void *sf_lazy_source(const sf_field *f, size_t *size);

/*
 * Writes field f's values C-contiguous into dst (sf_tensor_nbytes(&f->tensor) bytes): its recipe when
 * deferred, else a copy (strided or not). The one way batch rows, shm extents and frames get values.
 */
void sf_lazy_write_field(const sf_field *f, void *dst);

#endif
