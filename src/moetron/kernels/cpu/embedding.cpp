// Embedding on the CPU. Forward: one row copy per token. Backward without
// atomics: a stable counting sort groups the tokens by local row (in token
// order), then rows are spread over the threads and each row adds its
// tokens' gradients in token order. Every row's sum is therefore the same
// sequence of fp32 additions on any thread count, and the same as the
// reference's (which also adds in token order, one rounding per addition).
#include <cstring>

#include "moetron/kernels/cpu/cpu_util.h"
#include "moetron/kernels/cpu/simd16.h"
#include "moetron/kernels/embedding.h"
#include "moetron/kernels/embedding_checks.h"

namespace moetron::kernels::cpu {

namespace {

constexpr int64_t kParallelElems = 16384;

// Negative ids are errors: scanned on the host before any output is written.
void check_id_values(const char* fn, const Tensor& ids) {
  const int32_t* p = ptr<int32_t>(ids);
  for (int64_t t = 0; t < ids.dim(0); ++t) {
    MOETRON_CHECK(p[t] >= 0, fn, ": token ", t, " has negative id ", p[t]);
  }
}

// The shared shape checks, then the id values.
void check_ids(const char* fn, const Tensor& ids, const Tensor& table, const char* table_name,
               int64_t vocab_offset) {
  embedding_detail::check_ids_shapes(fn, ids, table, table_name, vocab_offset);
  check_id_values(fn, ids);
}

}  // namespace

void embedding_forward(Context&, const Tensor& ids, const Tensor& table, const Tensor& out,
                       int64_t vocab_offset) {
  check_ids("embedding_forward", ids, table, "embedding table", vocab_offset);
  const int64_t T = ids.dim(0), V = table.dim(0), D = table.dim(1);
  check_tensor(out, "embedding out", {T, D}, table.dtype());
  MOETRON_CHECK(table.dtype() == DType::f32 || table.dtype() == DType::bf16,
                "embedding_forward: the CPU backend takes an f32 or bf16 table, got ", table.str());
  const size_t row_bytes = static_cast<size_t>(D) * table.element_size();
  const auto* src = static_cast<const char*>(table.raw());
  auto* dst = static_cast<char*>(out.raw());
  const int32_t* pid = ptr<int32_t>(ids);
#pragma omp parallel for schedule(static) if (T * D > kParallelElems)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = pid[t] - vocab_offset;
    char* o = dst + static_cast<size_t>(t) * row_bytes;
    if (row >= 0 && row < V) {
      std::memcpy(o, src + static_cast<size_t>(row) * row_bytes, row_bytes);
    } else {
      std::memset(o, 0, row_bytes);  // the row lives on another vocab shard
    }
  }
}

Scratch embedding_backward_scratch(int64_t tokens, int64_t rows, int64_t dim) {
  MOETRON_CHECK(tokens >= 0 && rows >= 0 && dim >= 0, "embedding_backward_scratch: bad shape T ",
                tokens, " V ", rows, " D ", dim);
  if (tokens == 0 || rows == 0 || dim == 0) return {};  // the kernel returns before allocating
  // start [V + 1] and order [T] (held throughout), fill [V] (held while order is filled).
  Scratch s;
  add_scratch(s, rows + 1, DType::i64);
  add_scratch(s, tokens, DType::i64);
  add_scratch(s, rows, DType::i64);
  return s;
}

void embedding_backward(Context&, const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_offset) {
  check_ids("embedding_backward", ids, dtable, "embedding dtable", vocab_offset);
  const int64_t T = ids.dim(0), V = dtable.dim(0), D = dtable.dim(1);
  MOETRON_CHECK(dtable.dtype() == DType::f32, "embedding_backward: dtable must be f32, got ",
                dtable.str());
  check_shape(dout, "embedding dout", {T, D});
  if (T == 0 || V == 0 || D == 0) return;

  // start[r] .. start[r + 1]: positions in `order` of the tokens of local row r.
  Tensor start_t = Tensor::zeros({V + 1}, DType::i64, MemTag::workspace);
  Tensor order_t = Tensor::empty({T}, DType::i64, MemTag::workspace);
  int64_t* start = ptr<int64_t>(start_t);
  int64_t* order = ptr<int64_t>(order_t);
  const int32_t* pid = ptr<int32_t>(ids);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = pid[t] - vocab_offset;
    if (row >= 0 && row < V) ++start[row + 1];
  }
  for (int64_t r = 0; r < V; ++r) start[r + 1] += start[r];
  {
    Tensor fill_t = Tensor::empty({V}, DType::i64, MemTag::workspace);
    int64_t* next = ptr<int64_t>(fill_t);
    std::memcpy(next, start, static_cast<size_t>(V) * sizeof(int64_t));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = pid[t] - vocab_offset;
      if (row >= 0 && row < V) order[next[row]++] = t;  // ascending t: stable
    }
  }

  float* pdt = ptr<float>(dtable);
  dispatch_f32_bf16(dout.dtype(), "embedding_backward", [&](auto tag) {
    using S = decltype(tag);
    const S* pd = ptr<S>(dout);
    // Dynamic: token counts per row are uneven (frequent tokens).
#pragma omp parallel for schedule(dynamic, 64) \
    firstprivate(D, pd, pdt, start, order) if (T * D > kParallelElems)
    for (int64_t r = 0; r < V; ++r) {
      if (start[r] == start[r + 1]) continue;
      // Token-major: each dout row streams once, the dtable row stays in L1;
      // every element still sees its tokens in ascending order.
      float* acc = pdt + r * D;
      for (int64_t k = start[r]; k < start[r + 1]; ++k) {
        const S* g = pd + order[k] * D;
        for (int64_t j = 0; j < D; j += 16) {
          const simd::mask16 m = lane_mask(D - j);
          store16(acc + j, simd::add(load16(acc + j, m), load16(g + j, m)), m);
        }
      }
    }
  });
}

}  // namespace moetron::kernels::cpu
