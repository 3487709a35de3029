/* GIF fields through giflib: the first frame, or every frame composited as Pillow does (image_formats.h). */
#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>

#include "image_formats.h"

/* ---- GIF ----------------------------------------------------------------------------------- */

typedef struct gif_source {
  const uint8_t *data;
  size_t size, pos;
} gif_source;

static int gif_read(GifFileType *gif, GifByteType *buf, int n) {
  gif_source *s = gif->UserData;
  size_t left = s->size - s->pos, take = n < 0 ? 0 : (size_t)n;
  if (take > left) take = left;
  memcpy(buf, s->data + s->pos, take);
  s->pos += take;
  return (int)take;
}

/* Pillow's test for a palette that is only the gray ramp 0, 1, 2, ... (such a GIF opens as "L"). */
static bool gif_palette_needed(const ColorMapObject *map) {
  for (int i = 0; map && i < map->ColorCount; i++)
    if (map->Colors[i].Red != i || map->Colors[i].Green != i || map->Colors[i].Blue != i) return true;
  return false;
}

/* The color of index in map as Pillow shows it: indices past the palette's end (and palette-less files) gray. */
static void gif_color(const ColorMapObject *map, int index, uint8_t rgb[3]) {
  if (map && index < map->ColorCount) {
    rgb[0] = map->Colors[index].Red;
    rgb[1] = map->Colors[index].Green;
    rgb[2] = map->Colors[index].Blue;
  } else {
    rgb[0] = rgb[1] = rgb[2] = (uint8_t)index;
  }
}

/* What the records before an image say about it. */
typedef struct gif_frame_info {
  int transparent; /* the transparent index, or -1 */
  int disposal;    /* the graphics control's disposal bits, 0 when none */
} gif_frame_info;

/*
 * Reads records up to the next image descriptor, its graphics control into *info. Returns 1 at an image, 0 at
 * the end of the file, -1 on an error (the caller reports gif->Error).
 */
static int gif_next_image(GifFileType *gif, gif_frame_info *info) {
  info->transparent = -1;
  info->disposal = 0;
  for (;;) {
    GifRecordType type;
    if (DGifGetRecordType(gif, &type) == GIF_ERROR) return -1;
    if (type == TERMINATE_RECORD_TYPE) return 0;
    if (type == EXTENSION_RECORD_TYPE) {
      int ext_code;
      GifByteType *ext;
      if (DGifGetExtension(gif, &ext_code, &ext) == GIF_ERROR) return -1;
      /* Graphics control: byte 1 bit 0 says byte 4 is the transparent index; bits 2-4 are the disposal. */
      if (ext_code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4) {
        info->transparent = (ext[1] & 1) ? ext[4] : -1;
        info->disposal = (ext[1] >> 2) & 7;
      }
      while (ext)
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR) return -1;
      continue;
    }
    if (type != IMAGE_DESC_RECORD_TYPE) continue;
    return DGifGetImageDesc(gif) == GIF_ERROR ? -1 : 1;
  }
}

/* The current image's indices into dst (rows stride bytes apart); interlaced rows come in four passes. 0 or -1. */
static int gif_read_raster(GifFileType *gif, uint8_t *dst, size_t stride) {
  static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
  const GifImageDesc *d = &gif->Image;
  for (int pass = d->Interlace ? 0 : 3; pass < 4; pass++)
    for (int y = d->Interlace ? start[pass] : 0; y < d->Height; y += d->Interlace ? step[pass] : 1)
      if (DGifGetLine(gif, dst + (size_t)y * stride, d->Width) == GIF_ERROR) return -1;
  return 0;
}

static int gif_error(GifFileType *gif, sf_error *error) {
  return sf_error_set(error, gif->Error == D_GIF_ERR_NOT_ENOUGH_MEM ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                      "corrupt GIF: %s", GifErrorString(gif->Error));
}

/*
 * The first frame's index canvas as Pillow 9 makes it: the screen size (grown to the frame if that sticks
 * out) filled with the transparent index, or 0, the frame's indices written into it.  *canvas is newly
 * allocated (the caller frees it).
 */
static int gif_first_canvas(GifFileType *gif, const sf_image_limits *limits, gif_frame_info *info, uint8_t **canvas,
                            int64_t *width, int64_t *height, sf_error *error) {
  int r = gif_next_image(gif, info);
  if (r < 0) return gif_error(gif, error);
  if (r == 0) return sf_error_set(error, SF_EFORMAT, SF_NOWHERE, "corrupt GIF: no image in it");
  const GifImageDesc *desc = &gif->Image;
  int64_t left = desc->Left, top = desc->Top, fw = desc->Width, fh = desc->Height;
  *width = gif->SWidth > left + fw ? gif->SWidth : left + fw;
  *height = gif->SHeight > top + fh ? gif->SHeight : top + fh;
  if ((r = sf_image_check_pixels(*width, *height, limits, "GIF", error)) < 0) return r;
  size_t pixels = (size_t)*width * (size_t)*height;
  if (!(*canvas = malloc(pixels)))
    return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "cannot allocate a %lldx%lld GIF", (long long)*width,
                        (long long)*height);
  memset(*canvas, info->transparent >= 0 ? info->transparent : 0, pixels);
  if (fw > 0 && fh > 0 && gif_read_raster(gif, *canvas + (size_t)top * (size_t)*width + (size_t)left,
                                          (size_t)*width) < 0)
    return gif_error(gif, error);
  return 0;
}

/*
 * The first frame of a GIF as Pillow 9 decodes it: the index canvas of gif_first_canvas through the frame's
 * palette (or the global one; indices past its end and palette-less files are gray, as Pillow's ramp). A
 * transparent index gives RGBA in mode keep.
 */
int sf_image_decode_gif(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                      sf_tensor *out, sf_error *error) {
  gif_source src = {.data = p, .size = n};
  int code = 0;
  GifFileType *gif = DGifOpen(&src, gif_read, &code);
  if (!gif) return sf_error_set(error, code == D_GIF_ERR_NOT_ENOUGH_MEM ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                                "corrupt GIF header: %s", GifErrorString(code));
  uint8_t *canvas = NULL;
  int64_t width = 0, height = 0;
  gif_frame_info info;
  int r = gif_first_canvas(gif, limits, &info, &canvas, &width, &height, error);
  const ColorMapObject *map = gif->Image.ColorMap ? gif->Image.ColorMap : gif->SColorMap;
  bool gray = !gif_palette_needed(map), alpha = info.transparent >= 0;
  int channels = sf_image_channels_for(mode, alpha ? 4 : gray ? 1 : 3);
  if (r == 0) r = sf_image_alloc(out, height, width, channels, error);
  size_t pixels = (size_t)width * (size_t)height;
  uint8_t *dst = r == 0 ? sf_tensor_data(out) : NULL;
  for (size_t i = 0; dst && i < pixels; i++, dst += channels) {
    int index = canvas[i];
    uint8_t rgba[4] = {(uint8_t)index, (uint8_t)index, (uint8_t)index, index == info.transparent ? 0 : 255};
    if (!gray) gif_color(map, index, rgba);
    if (channels == 1)
      dst[0] = gray ? (uint8_t)index : sf_image_luma(rgba);
    else
      memcpy(dst, rgba, (size_t)channels);
  }
  if (r < 0) sf_tensor_clear(out);
  free(canvas);
  DGifCloseFile(gif, &code);
  return r;
}

/* A rectangle of the canvas: x0 <= x < x1, y0 <= y < y1 (clipped to it). */
typedef struct gif_box {
  int64_t x0, y0, x1, y1;
} gif_box;

static gif_box gif_frame_box(const GifFileType *gif, int64_t width, int64_t height) {
  const GifImageDesc *d = &gif->Image;
  gif_box b = {d->Left, d->Top, (int64_t)d->Left + d->Width, (int64_t)d->Top + d->Height};
  if (b.x1 > width) b.x1 = width;
  if (b.y1 > height) b.y1 = height;
  if (b.x0 > b.x1) b.x0 = b.x1;
  if (b.y0 > b.y1) b.y0 = b.y1;
  return b;
}

/*
 * How the previous frame is disposed of before the next is drawn, as Pillow 9's GifImagePlugin does it: its
 * disposal method (the last nonzero one seen: Pillow keeps it across frames that give none) decides, over the
 * previous frame's box, between nothing, a fill (the frame's transparent index with alpha 0, else the screen's
 * background color) and the canvas as it was before the frame was drawn.
 */
typedef struct gif_dispose {
  int kind;           /* 0 none, 2 fill, 3 restore */
  gif_box box;
  uint8_t fill[4];    /* RGBA; alpha 0 only matters on an RGBA canvas */
  int fill_index;     /* after the first frame: the index to fill its index canvas with */
  uint8_t *saved;     /* kind 3: the box's RGBA pixels before the frame (owned) */
} gif_dispose;

/* A GIF's frames being composed: the canvas (RGBA), the frames so far, the pending disposal. */
typedef struct gif_sequence {
  GifFileType *gif;
  const sf_image_limits *limits;
  int64_t width, height;
  size_t pixels;
  const ColorMapObject *map; /* the first frame's palette; NULL when Pillow reads it as gray ("L") */
  int transparent;           /* the first frame's transparent index, or -1 */
  int channels;              /* of the output */
  int method;                /* Pillow's disposal_method: the last nonzero one */
  uint8_t *rgba, *frame, *frames;
  int64_t count, capacity;
  gif_dispose dispose;
} gif_sequence;

/* Appends the canvas to the frames, in the output's channels. */
static int gif_append(gif_sequence *q, sf_error *error) {
  int64_t max = sf_image_max_pixels(q->limits);
  if (q->count >= max / (int64_t)q->pixels)
    return sf_error_set(error, SF_ETOOBIG, SF_NOWHERE,
                        "GIF of %lldx%lld pixels has more than %lld frames, over max_pixels %lld in all; raise "
                        "max_pixels if it is genuine",
                        (long long)q->width, (long long)q->height, (long long)q->count, (long long)max);
  if (q->count == q->capacity) {
    int64_t capacity = q->capacity ? q->capacity * 2 : 8;
    uint8_t *grown = realloc(q->frames, (size_t)capacity * q->pixels * (size_t)q->channels);
    if (!grown)
      return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory for %lld GIF frames", (long long)capacity);
    q->frames = grown;
    q->capacity = capacity;
  }
  uint8_t *dst = q->frames + (size_t)q->count++ * q->pixels * (size_t)q->channels;
  for (size_t i = 0; i < q->pixels; i++, dst += q->channels) {
    const uint8_t *px = q->rgba + 4 * i;
    if (q->channels == 1) dst[0] = sf_image_luma(px);
    else memcpy(dst, px, (size_t)q->channels);
  }
  return 0;
}

/* The pending disposal, over the canvas. After the first frame it works on the index canvas (Pillow's "P"). */
static void gif_dispose_apply(gif_sequence *q, bool after_first) {
  const gif_dispose *d = &q->dispose;
  size_t box_width = (size_t)(d->box.x1 - d->box.x0);
  for (int64_t y = d->box.y0; d->kind && y < d->box.y1; y++)
    for (int64_t x = d->box.x0; x < d->box.x1; x++) {
      uint8_t *px = q->rgba + 4 * ((size_t)y * (size_t)q->width + (size_t)x);
      if (after_first) {
        gif_color(q->map, d->fill_index, px);
        px[3] = d->fill_index == q->transparent ? 0 : 255;
      } else if (d->kind == 2) {
        memcpy(px, d->fill, q->transparent >= 0 ? 4 : 3);
      } else {
        memcpy(px, d->saved + 4 * ((size_t)(y - d->box.y0) * box_width + (size_t)(x - d->box.x0)), 4);
      }
    }
}

/* The disposal of the frame about to be drawn (info, map), worked out before it is: a restore saves the canvas. */
static int gif_dispose_plan(gif_sequence *q, const gif_frame_info *info, const ColorMapObject *map, sf_error *error) {
  gif_box box = gif_frame_box(q->gif, q->width, q->height);
  free(q->dispose.saved);
  q->dispose = (gif_dispose){.kind = q->method < 2 ? 0 : q->method == 2 ? 2 : 3, .box = box};
  if (q->dispose.kind == 2) {
    gif_color(map, info->transparent >= 0 ? info->transparent : q->gif->SBackGroundColor, q->dispose.fill);
    q->dispose.fill[3] = info->transparent >= 0 ? 0 : 255;
  } else if (q->dispose.kind == 3) {
    size_t bw = (size_t)(box.x1 - box.x0), bh = (size_t)(box.y1 - box.y0);
    if (!(q->dispose.saved = malloc(bw * bh * 4 + 1)))
      return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory for a GIF frame");
    for (size_t y = 0; y < bh; y++)
      memcpy(q->dispose.saved + y * bw * 4, q->rgba + 4 * (((size_t)box.y0 + y) * (size_t)q->width + (size_t)box.x0),
             bw * 4);
  }
  return 0;
}

/* Reads the current frame's indices and draws them over the canvas, but where they are transparent. */
static int gif_draw(gif_sequence *q, const gif_frame_info *info, const ColorMapObject *map, sf_error *error) {
  const GifImageDesc *d = &q->gif->Image;
  int64_t fw = d->Width, fh = d->Height;
  if (fw <= 0 || fh <= 0) return 0;
  int r = sf_image_check_pixels(fw, fh, q->limits, "GIF frame", error);
  if (r < 0) return r;
  uint8_t *grown = realloc(q->frame, (size_t)fw * (size_t)fh);
  if (!grown) return sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory for a GIF frame");
  q->frame = grown;
  if (gif_read_raster(q->gif, q->frame, (size_t)fw) < 0) return gif_error(q->gif, error);
  gif_box box = gif_frame_box(q->gif, q->width, q->height);
  for (int64_t y = box.y0; y < box.y1; y++)
    for (int64_t x = box.x0; x < box.x1; x++) {
      int i = q->frame[(size_t)(y - d->Top) * (size_t)fw + (size_t)(x - d->Left)];
      if (i == info->transparent) continue;
      uint8_t *px = q->rgba + 4 * ((size_t)y * (size_t)q->width + (size_t)x);
      gif_color(map, i, px);
      px[3] = 255;
    }
  return 0;
}

/* The first frame's canvas, palette and disposal; the canvas as RGBA. */
static int gif_sequence_start(gif_sequence *q, sf_image_mode mode, sf_error *error) {
  uint8_t *index = NULL;
  gif_frame_info info;
  int r = gif_first_canvas(q->gif, q->limits, &info, &index, &q->width, &q->height, error);
  const ColorMapObject *map = q->gif->Image.ColorMap ? q->gif->Image.ColorMap : q->gif->SColorMap;
  q->map = gif_palette_needed(map) ? map : NULL;
  q->transparent = info.transparent;
  q->channels = sf_image_channels_for(mode, info.transparent >= 0 ? 4 : 3);
  q->method = info.disposal;
  q->pixels = (size_t)q->width * (size_t)q->height;
  if (r == 0 && !(q->rgba = malloc(q->pixels * 4)))
    r = sf_error_set(error, SF_ENOMEM, SF_NOWHERE, "out of memory for a %lldx%lld GIF", (long long)q->width,
                     (long long)q->height);
  if (r == 0) {
    /* The first frame's own disposal fills its index canvas: with the transparent index (also for a restore,
     * there being nothing before), else the background's. */
    q->dispose.box = gif_frame_box(q->gif, q->width, q->height);
    q->dispose.kind = q->method == 2 || (q->method >= 3 && info.transparent >= 0) ? 2 : 0;
    q->dispose.fill_index = info.transparent >= 0 ? info.transparent : q->gif->SBackGroundColor;
    for (size_t i = 0; i < q->pixels; i++) {
      gif_color(q->map, index[i], q->rgba + 4 * i);
      q->rgba[4 * i + 3] = index[i] == info.transparent ? 0 : 255;
    }
  }
  free(index);
  return r;
}

/*
 * Every frame of a GIF as Pillow 9 iterates them (ImageSequence, each converted to RGB): the first as
 * decode_gif makes it; then on an RGB canvas (RGBA when the first frame has a transparent index) each frame
 * drawn over the last, its transparent pixels leaving the canvas as it was, after the last frame's disposal.
 * Frames that stick out of the first frame's canvas are clipped to it. A [T, H, W, C] tensor: C 3 for rgb, 1
 * for gray (luma), 4 for keep when the first frame has a transparent index, else 3. A palette-less or gray-ramp
 * GIF (which Pillow opens as "L") is drawn the same way, its indices as gray levels. max_pixels bounds
 * T x H x W.
 */
int sf_image_decode_gif_frames(const uint8_t *p, size_t n, sf_image_mode mode, const sf_image_limits *limits,
                             sf_tensor *out, sf_error *error) {
  gif_source src = {.data = p, .size = n};
  int code = 0;
  gif_sequence q = {.gif = DGifOpen(&src, gif_read, &code), .limits = limits};
  if (!q.gif) return sf_error_set(error, code == D_GIF_ERR_NOT_ENOUGH_MEM ? SF_ENOMEM : SF_EFORMAT, SF_NOWHERE,
                                  "corrupt GIF header: %s", GifErrorString(code));
  int r = gif_sequence_start(&q, mode, error);
  for (bool first = true; r == 0; first = false) {
    if ((r = gif_append(&q, error)) < 0) break;
    /* The next frame: its records, then the last one's disposal, then its own planned, then its pixels. */
    gif_frame_info info;
    int got = gif_next_image(q.gif, &info);
    if (got < 0) r = gif_error(q.gif, error);
    if (got != 1) break;
    if (info.disposal) q.method = info.disposal;
    const ColorMapObject *map = q.gif->Image.ColorMap ? q.gif->Image.ColorMap : q.gif->SColorMap;
    if (!gif_palette_needed(map)) map = NULL;
    gif_dispose_apply(&q, first);
    if ((r = gif_dispose_plan(&q, &info, map, error)) == 0) r = gif_draw(&q, &info, map, error);
  }
  if (r == 0) {
    const int64_t shape[4] = {q.count, q.height, q.width, q.channels};
    r = sf_tensor_alloc(out, SF_DTYPE_UINT8, 4, shape);
    if (r < 0) r = sf_error_set(error, r, SF_NOWHERE, "cannot allocate %lld GIF frames", (long long)q.count);
    else memcpy(sf_tensor_data(out), q.frames, (size_t)q.count * q.pixels * (size_t)q.channels);
  }
  if (r < 0) sf_tensor_clear(out);
  free(q.dispose.saved);
  free(q.frames);
  free(q.frame);
  free(q.rgba);
  DGifCloseFile(q.gif, &code);
  return r;
}
