// The device sink's normalise kernel: uint8 pixels in, float32 or bfloat16 CHW out, through the
// per-channel tables the CPU path (augment) uses, so the values are the same bits. tools/gen-ptx.sh
// compiles it to PTX (device_kernels_ptx.h, committed), which the driver compiles for its GPU at load time.
// Grid: x strides over the pixels of one plane, y over the planes (image b, channel c: b * channels + c).
extern "C" __global__ void sf_normalize_u8(const unsigned char *src, long long sb, long long sc, long long sy,
                                           long long sx, void *dst, const void *lut, unsigned channels,
                                           unsigned height, unsigned width, unsigned planes, unsigned out_size) {
  unsigned pixels = height * width;
#pragma unroll 1
  for (unsigned plane = blockIdx.y; plane < planes; plane += gridDim.y) {
    unsigned b = plane / channels, c = plane % channels;
    const unsigned char *in = src + b * sb + c * sc;
#pragma unroll 1
    for (unsigned p = blockIdx.x * blockDim.x + threadIdx.x; p < pixels; p += gridDim.x * blockDim.x) {
      unsigned y = p / width, x = p % width;
      unsigned v = in[y * sy + x * sx];
      unsigned long long at = (unsigned long long)plane * pixels + p;
      if (out_size == 4)
        ((unsigned *)dst)[at] = ((const unsigned *)lut)[c * 256 + v];
      else
        ((unsigned short *)dst)[at] = ((const unsigned short *)lut)[c * 256 + v];
    }
  }
}
