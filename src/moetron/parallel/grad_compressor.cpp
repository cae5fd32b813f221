#include "moetron/parallel/grad_compressor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "moetron/core/error.h"

namespace moetron::parallel {

CompressKind parse_compress_kind(const std::string& name) {
  if (name == "none") return CompressKind::none;
  if (name == "int8") return CompressKind::int8;
  if (name == "int4") return CompressKind::int4;
  if (name == "sign") return CompressKind::sign;
  if (name == "topk") return CompressKind::topk;
  if (name == "sparse_sign") return CompressKind::sparse_sign;
  MOETRON_FAIL("unknown gradient compression '", name,
               "' (none, int8, int4, sign, topk, sparse_sign)");
}

std::string compress_kind_name(CompressKind k) {
  switch (k) {
    case CompressKind::none:
      return "none";
    case CompressKind::int8:
      return "int8";
    case CompressKind::int4:
      return "int4";
    case CompressKind::sign:
      return "sign";
    case CompressKind::topk:
      return "topk";
    case CompressKind::sparse_sign:
      return "sparse_sign";
  }
  return "?";
}

namespace {

int64_t blocks(const CompressOptions& o, int64_t n) {
  return (n + o.block - 1) / o.block;
}
int64_t topk_count(const CompressOptions& o, int64_t n) {
  return n == 0 ? 0
                : std::clamp<int64_t>(
                      static_cast<int64_t>(std::ceil(o.topk_ratio * static_cast<double>(n))), 1, n);
}

void put_f32(uint8_t* p, float v) {
  std::memcpy(p, &v, 4);
}
float get_f32(const uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// The sign encodings' scale: mean |x| over [lo, hi), summed in double.
float mean_abs(const float* x, int64_t lo, int64_t hi) {
  double sum = 0;
  for (int64_t i = lo; i < hi; ++i) sum += std::fabs(x[i]);
  return static_cast<float>(sum / static_cast<double>(hi - lo));
}

int64_t kept_blocks(const CompressOptions& o, int64_t n) {
  const int64_t nb = blocks(o, n);
  return nb == 0 ? 0
                 : std::clamp<int64_t>(
                       static_cast<int64_t>(std::ceil(o.keep * static_cast<double>(nb))), 1, nb);
}
// Bytes of one kept block of sparse_sign: its scale and a full block of sign bits.
int64_t kept_block_bytes(const CompressOptions& o) {
  return 4 + (o.block + 7) / 8;
}

// sparse_sign: [bitmap of kept blocks][per kept block, in block order:
// f32 scale, sign bits]. Ties in mean |x| keep the lower block index, so
// every rank encodes the same way.
void encode_sparse_sign(const CompressOptions& o, const float* x, int64_t n, uint8_t* out) {
  const int64_t nb = blocks(o, n), k = kept_blocks(o, n), map_bytes = (nb + 7) / 8;
  std::memset(out, 0, static_cast<size_t>(map_bytes + k * kept_block_bytes(o)));
  if (nb == 0) return;
  std::vector<float> mean(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * o.block, hi = std::min(n, lo + o.block);
    mean[static_cast<size_t>(b)] = mean_abs(x, lo, hi);
  }
  std::vector<uint32_t> order(static_cast<size_t>(nb));
  std::iota(order.begin(), order.end(), 0u);
  auto before = [&mean](uint32_t a, uint32_t b) {
    return mean[a] > mean[b] || (mean[a] == mean[b] && a < b);
  };
  std::nth_element(order.begin(), order.begin() + k - 1, order.end(), before);
  for (int64_t j = 0; j < k; ++j) {
    const uint32_t b = order[static_cast<size_t>(j)];
    out[b / 8] |= static_cast<uint8_t>(1u << (b % 8));
  }
  uint8_t* kept = out + map_bytes;
  for (int64_t b = 0; b < nb; ++b) {
    if (!((out[b / 8] >> (b % 8)) & 1u)) continue;
    put_f32(kept, mean[static_cast<size_t>(b)]);
    uint8_t* bits = kept + 4;
    const int64_t lo = b * o.block, hi = std::min(n, lo + o.block);
    for (int64_t i = lo; i < hi; ++i) {
      if (x[i] < 0) bits[(i - lo) / 8] |= static_cast<uint8_t>(1u << ((i - lo) % 8));
    }
    kept += kept_block_bytes(o);
  }
}

void decode_add_sparse_sign(const CompressOptions& o, const uint8_t* in, int64_t n, float* y) {
  const int64_t nb = blocks(o, n), map_bytes = (nb + 7) / 8;
  const uint8_t* kept = in + map_bytes;
  int64_t seen = 0;
  for (int64_t b = 0; b < nb; ++b) {
    if (!((in[b / 8] >> (b % 8)) & 1u)) continue;
    MOETRON_CHECK(++seen <= kept_blocks(o, n), "sparse_sign encoding marks more than ",
                  kept_blocks(o, n), " kept blocks");
    const float scale = get_f32(kept);
    const uint8_t* bits = kept + 4;
    const int64_t lo = b * o.block, hi = std::min(n, lo + o.block);
    for (int64_t i = lo; i < hi; ++i)
      y[i] += (bits[(i - lo) / 8] >> ((i - lo) % 8)) & 1u ? -scale : scale;
    kept += kept_block_bytes(o);
  }
}

}  // namespace

int64_t encoded_bytes(const CompressOptions& o, int64_t n) {
  switch (o.kind) {
    case CompressKind::none:
      return 4 * n;
    case CompressKind::int8:
      return n + 4 * blocks(o, n);
    case CompressKind::int4:
      return (n + 1) / 2 + 4 * blocks(o, n);
    case CompressKind::sign:
      return (n + 7) / 8 + 4 * blocks(o, n);
    case CompressKind::topk:
      return 8 * topk_count(o, n);
    case CompressKind::sparse_sign:
      return (blocks(o, n) + 7) / 8 + kept_blocks(o, n) * kept_block_bytes(o);
  }
  return 0;
}

void encode(const CompressOptions& o, const float* x, int64_t n, uint8_t* out) {
  MOETRON_CHECK(o.block > 0, "compression block must be positive");
  switch (o.kind) {
    case CompressKind::none:
      std::memcpy(out, x, static_cast<size_t>(4 * n));
      return;
    case CompressKind::int8:
    case CompressKind::int4: {
      const float qmax = o.kind == CompressKind::int8 ? 127.0f : 7.0f;
      const int64_t nb = blocks(o, n);
      uint8_t* q = out + 4 * nb;
      if (o.kind == CompressKind::int4) std::memset(q, 0, static_cast<size_t>((n + 1) / 2));
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * o.block, hi = std::min(n, lo + o.block);
        float mx = 0;
        for (int64_t i = lo; i < hi; ++i) mx = std::max(mx, std::fabs(x[i]));
        const float scale = mx / qmax;
        put_f32(out + 4 * b, scale);
        const float inv = scale > 0 ? 1.0f / scale : 0.0f;
        for (int64_t i = lo; i < hi; ++i) {
          const auto v = static_cast<int>(std::clamp(std::nearbyint(x[i] * inv), -qmax, qmax));
          if (o.kind == CompressKind::int8) {
            q[i] = static_cast<uint8_t>(static_cast<int8_t>(v));
          } else {
            q[i / 2] |= static_cast<uint8_t>((v & 0xF) << (4 * (i % 2)));
          }
        }
      }
      return;
    }
    case CompressKind::sign: {
      const int64_t nb = blocks(o, n);
      uint8_t* bits = out + 4 * nb;
      std::memset(bits, 0, static_cast<size_t>((n + 7) / 8));
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t lo = b * o.block, hi = std::min(n, lo + o.block);
        put_f32(out + 4 * b, mean_abs(x, lo, hi));
        for (int64_t i = lo; i < hi; ++i) {
          if (x[i] < 0) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
        }
      }
      return;
    }
    case CompressKind::topk: {
      const int64_t k = topk_count(o, n);
      std::vector<uint32_t> idx(static_cast<size_t>(n));
      std::iota(idx.begin(), idx.end(), 0u);
      // Larger magnitude first, lower index on ties: deterministic on every rank.
      auto before = [x](uint32_t a, uint32_t b) {
        const float fa = std::fabs(x[a]), fb = std::fabs(x[b]);
        return fa > fb || (fa == fb && a < b);
      };
      std::nth_element(idx.begin(), idx.begin() + k - 1, idx.end(), before);
      std::sort(idx.begin(), idx.begin() + k);
      for (int64_t j = 0; j < k; ++j) {
        const uint32_t i = idx[static_cast<size_t>(j)];
        std::memcpy(out + 8 * j, &i, 4);
        put_f32(out + 8 * j + 4, x[i]);
      }
      return;
    }
    case CompressKind::sparse_sign:
      encode_sparse_sign(o, x, n, out);
      return;
  }
}

void decode_add(const CompressOptions& o, const uint8_t* in, int64_t n, float* y) {
  switch (o.kind) {
    case CompressKind::none:
      for (int64_t i = 0; i < n; ++i) y[i] += get_f32(in + 4 * i);
      return;
    case CompressKind::int8:
    case CompressKind::int4: {
      const int64_t nb = blocks(o, n);
      const uint8_t* q = in + 4 * nb;
      for (int64_t b = 0; b < nb; ++b) {
        const float scale = get_f32(in + 4 * b);
        const int64_t lo = b * o.block, hi = std::min(n, lo + o.block);
        for (int64_t i = lo; i < hi; ++i) {
          int v;
          if (o.kind == CompressKind::int8) {
            v = static_cast<int8_t>(q[i]);
          } else {
            v = (q[i / 2] >> (4 * (i % 2))) & 0xF;
            if (v >= 8) v -= 16;
          }
          y[i] += scale * static_cast<float>(v);
        }
      }
      return;
    }
    case CompressKind::sign: {
      const int64_t nb = blocks(o, n);
      const uint8_t* bits = in + 4 * nb;
      for (int64_t b = 0; b < nb; ++b) {
        const float scale = get_f32(in + 4 * b);
        const int64_t lo = b * o.block, hi = std::min(n, lo + o.block);
        for (int64_t i = lo; i < hi; ++i) y[i] += (bits[i / 8] >> (i % 8)) & 1u ? -scale : scale;
      }
      return;
    }
    case CompressKind::topk: {
      const int64_t k = topk_count(o, n);
      for (int64_t j = 0; j < k; ++j) {
        uint32_t i;
        std::memcpy(&i, in + 8 * j, 4);
        MOETRON_CHECK(static_cast<int64_t>(i) < n, "top-k index ", i, " outside a chunk of ", n);
        y[i] += get_f32(in + 8 * j + 4);
      }
      return;
    }
    case CompressKind::sparse_sign:
      decode_add_sparse_sign(o, in, n, y);
      return;
  }
}

}  // namespace moetron::parallel
