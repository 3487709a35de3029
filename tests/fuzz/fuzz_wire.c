/*
 * Fuzz target: the wire header decoder (sf_wire_decode) with its payload frames.
 * Input: u32 LE header length L (bit 31 set: place the frames at odd
 * addresses), L header bytes, then frames as u32 LE length + bytes until the
 * input ends (lengths are clamped to what is left).  tests/unit/test_wire.c
 * writes the seed corpus (SF_WIRE_CORPUS=DIR).
 */
#include <stdlib.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_FRAMES = 256 };

static uint32_t read_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void drop_backing(void *opaque, uint8_t *data) {
  sf_buffer *b = opaque;
  sf_buffer_unref(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  uint32_t word = read_u32(data);
  bool odd = word >> 31;
  size_t header_len = word & 0x7fffffffu;
  data += 4;
  size -= 4;
  if (header_len > size) header_len = size;
  const uint8_t *header = data;
  data += header_len;
  size -= header_len;

  sf_buffer *frames[MAX_FRAMES];
  int n = 0;
  while (size >= 4 && n < MAX_FRAMES) {
    size_t len = read_u32(data);
    data += 4;
    size -= 4;
    if (len > size) len = size;
    /* Exact-size copies so that ASan sees any read past a frame; odd addresses exercise the aligned copy. */
    sf_buffer *b = sf_buffer_new(odd ? len + 1 : len);
    if (!b) break;
    if (odd) { /* a view at offset 1 that owns its backing buffer */
      memcpy(sf_buffer_data(b) + 1, data, len);
      sf_buffer *view = sf_buffer_wrap(sf_buffer_data(b) + 1, len, drop_backing, b);
      if (!view) {
        sf_buffer_unref(&b);
        break;
      }
      frames[n++] = view;
      data += len;
      size -= len;
      continue;
    }
    memcpy(sf_buffer_data(b), data, len);
    frames[n++] = b;
    data += len;
    size -= len;
  }

  sf_wire_message msg = {0};
  sf_error error;
  int r = sf_wire_decode(header, header_len, frames, n, &msg, &error);
  if (r == 0) {
    /* Every decoded field must be a contiguous tensor exactly covering readable memory. */
    for (int i = 0; i < msg.n_samples; i++) {
      sf_sample *s = msg.samples[i];
      volatile size_t k = strlen(s->key) + strlen(sf_sample_url(s));
      (void)k;
      for (int j = 0; j < s->n_fields; j++) {
        const sf_tensor *t = &s->fields[j].tensor;
        if (!t->buffer) continue;
        size_t bytes = sf_tensor_nbytes(t);
        if (bytes != sf_buffer_size(t->buffer) || !sf_tensor_is_contiguous(t)) abort();
        if ((uintptr_t)sf_tensor_data(t) % sf_dtype_size(t->dtype) != 0) abort();
        if (bytes) {
          volatile uint8_t first = ((const uint8_t *)sf_tensor_data(t))[0];
          volatile uint8_t last = ((const uint8_t *)sf_tensor_data(t))[bytes - 1];
          (void)first;
          (void)last;
        }
      }
    }
    if (msg.text) {
      volatile size_t k = strlen(msg.text);
      (void)k;
    }
  } else if (r != SF_EFORMAT && r != SF_ETOOBIG && r != SF_ENOMEM) {
    abort(); /* the decoder promises nothing else */
  }
  sf_wire_message_clear(&msg);
  for (int i = 0; i < n; i++) sf_buffer_unref(&frames[i]);
  return 0;
}
