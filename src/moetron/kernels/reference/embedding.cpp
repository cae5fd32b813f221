// Embedding gather and scatter-add in double. Row id - vocab_offset of the
// local table; ids outside [vocab_offset, vocab_offset + V_local) belong to
// another vocab shard (zero output, no gradient); negative ids are errors.
#include "moetron/kernels/embedding.h"
#include "moetron/kernels/reference/ref_util.h"

namespace moetron::kernels::reference {

namespace {
std::vector<int64_t> checked_ids(const char* fn, const Tensor& ids, const Tensor& table,
                                 const char* table_name, int64_t vocab_offset) {
  MOETRON_CHECK(ids.rank() == 1, fn, ": ids must be [T], got ", ids.str());
  MOETRON_CHECK(table.rank() == 2, fn, ": ", table_name, " must be [V_local, D], got ",
                table.str());
  MOETRON_CHECK(is_floating(table.dtype()), fn, ": ", table_name, " must be a float tensor, got ",
                table.str());
  MOETRON_CHECK(vocab_offset >= 0, fn, ": vocab_offset must be >= 0, got ", vocab_offset);
  std::vector<int64_t> v = load_ids(ids);
  for (size_t t = 0; t < v.size(); ++t) {
    MOETRON_CHECK(v[t] >= 0, fn, ": token ", t, " has negative id ", v[t]);
  }
  return v;
}
}  // namespace

void embedding_forward(Context&, const Tensor& ids, const Tensor& table, const Tensor& out,
                       int64_t vocab_offset) {
  const std::vector<int64_t> v =
      checked_ids("embedding_forward", ids, table, "embedding table", vocab_offset);
  const int64_t T = ids.dim(0), V = table.dim(0), D = table.dim(1);
  check_tensor(out, "embedding out", {T, D}, table.dtype());
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = v[static_cast<size_t>(t)] - vocab_offset;
    const bool local = row >= 0 && row < V;
    for (int64_t j = 0; j < D; ++j) store(out, t * D + j, local ? load(table, row * D + j) : 0.0);
  }
}

void embedding_backward(Context&, const Tensor& ids, const Tensor& dout, const Tensor& dtable,
                        int64_t vocab_offset) {
  const std::vector<int64_t> v =
      checked_ids("embedding_backward", ids, dtable, "embedding dtable", vocab_offset);
  const int64_t T = ids.dim(0), V = dtable.dim(0), D = dtable.dim(1);
  check_shape(dout, "embedding dout", {T, D});
  MOETRON_CHECK(is_floating(dout.dtype()), "embedding_backward: dout must be a float tensor, got ",
                dout.str());
  // Token order, one rounding into dtable's dtype per addition.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = v[static_cast<size_t>(t)] - vocab_offset;
    if (row < 0 || row >= V) continue;
    for (int64_t j = 0; j < D; ++j) {
      store(dtable, row * D + j, load(dtable, row * D + j) + load(dout, t * D + j));
    }
  }
}

}  // namespace moetron::kernels::reference
