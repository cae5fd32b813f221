// The CPU attention kernels' scratch, from their own tile constants
// (attention_tiles.h): the buffers attention_forward.cpp and
// attention_backward.cpp allocate, listed in the order they allocate them.
// tests/kernels/workspace_test.cpp holds these lists to the
// allocator's workspace peak, so a buffer added to a kernel and not here
// fails there.
#include "moetron/kernels/attention.h"
#include "moetron/kernels/cpu/attention_tiles.h"

namespace moetron::kernels::cpu {

using namespace attn;

namespace {

void check_scratch_shape(const char* fn, const AttentionShape& s) {
  MOETRON_CHECK(s.dtype == DType::f32 || s.dtype == DType::bf16, fn,
                ": the CPU kernels take f32 or bf16 (f16 is staged by the front-end), got ",
                dtype_name(s.dtype));
  MOETRON_CHECK(s.batch >= 0 && s.seq_q >= 0 && s.seq_k >= 0 && s.heads >= 1 && s.kv_heads >= 1 &&
                    s.head_dim >= 1 && s.heads % s.kv_heads == 0,
                fn, ": bad shape B ", s.batch, " Sq ", s.seq_q, " Sk ", s.seq_k, " H ", s.heads,
                " Hkv ", s.kv_heads, " hd ", s.head_dim);
}

}  // namespace

Scratch attention_forward_scratch(const AttentionShape& s) {
  check_scratch_shape("attention_forward_scratch", s);
  const int64_t hdp = round_up(s.head_dim, 16), nkb = ceil_div(s.seq_k, kBk);
  const int64_t tile = kBk * hdp;
  Scratch out;
  // Per thread: packed K and V tiles of every key block, the raw tile they
  // are packed from, which task packed each block, the query and P tiles.
  for (int64_t n : {nkb * tile, nkb * tile, tile}) add_scratch(out, n, s.dtype, true);
  add_scratch(out, nkb, DType::i64, true);
  for (int64_t n : {kBq * hdp, kBq * kBk}) add_scratch(out, n, s.dtype, true);
  // Scores, the output accumulator and the running max, sum and rescale factor.
  for (int64_t n : {kBq * kBk, kBq * hdp, kBq, kBq, kBq}) add_scratch(out, n, DType::f32, true);
  return out;
}

// The grouped-heads reduction after the main parallel region holds two f32
// rows of hdp per thread, after these are freed: never the peak.
Scratch attention_backward_scratch(const AttentionShape& s) {
  check_scratch_shape("attention_backward_scratch", s);
  const bool packs_pairs = dtype_size(s.dtype) == 2;  // kPack<T> == 2: bf16
  const int64_t hdp = round_up(s.head_dim, 16);
  const int64_t nqb = ceil_div(s.seq_q, kBq), nkb = ceil_div(s.seq_k, kBk);
  const int64_t ktile = kBk * hdp, qtile = kBq * hdp;
  Scratch out;
  // Grouped heads: each query head's dK/dV partials, summed in head order.
  if (s.heads / s.kv_heads > 1) {
    add_scratch(out, 2 * s.batch * s.heads * nkb * ktile, DType::f32);
  }
  // Per thread: K (two layouts) and V of every key block, Q and dO of every
  // query block (and their pair-packed copies for bf16), the raw tile.
  for (int64_t n : {nkb * ktile, nkb * ktile, nkb * ktile, nqb * qtile, nqb * qtile}) {
    add_scratch(out, n, s.dtype, true);
  }
  if (packs_pairs) {
    add_scratch(out, nqb * qtile, s.dtype, true);
    add_scratch(out, nqb * qtile, s.dtype, true);
  }
  add_scratch(out, ktile, s.dtype, true);
  // lse and D per query row, the dQ, dK and dV accumulators, S and dP.
  for (int64_t n : {nqb * kBq, nqb * kBq, nqb * qtile, ktile, ktile, kBq * kBk, kBq * kBk}) {
    add_scratch(out, n, DType::f32, true);
  }
  // P and dS in the layouts the tile GEMMs read.
  for (int64_t n : {kBq * kBk, kBq * kBk, kBq * kBk}) add_scratch(out, n, s.dtype, true);
  return out;
}

}  // namespace moetron::kernels::cpu
