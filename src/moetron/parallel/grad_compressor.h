// Gradient compressors for the data-parallel reduction, each used with error
// feedback (the caller keeps residual = what was meant minus what was sent,
// and adds it to the next step's gradient).
//
//   int8  per block of `block` values: fp32 scale = max|x| / 127, q = rne(x / scale)
//         error <= scale / 2 per value
//   int4  the same with scale = max|x| / 7, two values per byte
//         error <= scale / 2 per value
//   sign  1 bit per value and fp32 scale = mean|x| of the block: x -> scale * sign(x)
//         (signSGD / 1-bit Adam style; preserves every sign and each block's mean |x|)
//   topk  the ceil(ratio * n) largest |x| as (u32 index, f32 value); the rest 0
//         kept values exact, every dropped |x| <= the smallest kept |x|
//   sparse_sign  sign for the ceil(keep * blocks) blocks of largest mean |x|
//         only: a bitmap of the kept blocks, then per kept block its fp32
//         scale (mean |x|) and its sign bits; the other blocks decode to 0
//         and stay whole in the sender's residual (quantisation plus
//         sparsification with error compensation: under 1 bit per value,
//         (1/block + keep * (1 + 32/block)) bits; 0.848 at keep 0.75, block 256)
//
// Encodings have a size that depends only on (kind, n), so chunks of equal
// length exchange with a plain all-to-all.
#pragma once

#include <cstdint>
#include <string>

namespace moetron::parallel {

enum class CompressKind { none, int8, int4, sign, topk, sparse_sign };

struct CompressOptions {
  CompressKind kind = CompressKind::none;
  int64_t block = 256;       // int8 / int4 / sign
  double topk_ratio = 0.01;  // topk
  double keep = 0.75;        // sparse_sign: share of blocks sent each time
};

// none|int8|int4|sign|topk|sparse_sign
CompressKind parse_compress_kind(const std::string& name);
std::string compress_kind_name(CompressKind k);

// Bytes of the encoding of n values.
int64_t encoded_bytes(const CompressOptions& o, int64_t n);
// out: encoded_bytes(o, n) bytes.
void encode(const CompressOptions& o, const float* x, int64_t n, uint8_t* out);
// y[i] += decoded value i.
void decode_add(const CompressOptions& o, const uint8_t* in, int64_t n, float* y);

}  // namespace moetron::parallel
