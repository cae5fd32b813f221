// Embedding gather and deterministic scatter-add at the bench-moe shape:
// 4096 token ids into a [8192, 512] table.
#include <vector>

#include "moetron/kernels/embedding.h"
#include "pointwise_bench.h"

namespace moetron::bench {
namespace {

void bench_embedding(Runner& runner) {
  const int64_t T = 4096, V = 8192, D = 512;
  kernels::Context ctx(kernels::Backend::cpu, runner.threads());
  Tensor ids = Tensor::empty({T}, DType::i32);
  PhiloxStream rng(7, "ids");
  std::vector<char> touched(V, 0);
  for (int64_t t = 0; t < T; ++t) {
    const auto id = static_cast<int32_t>(rng.next_u32() % V);
    ids.data<int32_t>()[t] = id;
    touched[static_cast<size_t>(id)] = 1;
  }
  double rows_touched = 0;
  for (char c : touched) rows_touched += c;
  Tensor dtable = Tensor::zeros({V, D}, DType::f32);
  for (DType dt : {DType::f32, DType::bf16}) {
    const double es = static_cast<double>(dtype_size(dt));
    Tensor table = bench_random({V, D}, dt, "table");
    Tensor out = Tensor::empty({T, D}, dt);
    Tensor dout = bench_random({T, D}, dt, "dout");
    const double td = static_cast<double>(T * D);
    // forward: read ids and the gathered rows, write out
    time_bandwidth(runner, "embedding/embedding_fwd", "4096 ids, [8192, 512]", dt,
                   2 * td * es + 4.0 * T,
                   [&] { kernels::embedding_forward(ctx, ids, table, out, 0); });
    // backward: read ids and dout, read and write the touched f32 dtable rows
    time_bandwidth(runner, "embedding/embedding_bwd", "4096 ids, [8192, 512]", dt,
                   td * es + 4.0 * T + 2 * rows_touched * D * 4.0,
                   [&] { kernels::embedding_backward(ctx, ids, dout, dtable, 0); });
  }
}

}  // namespace
MOETRON_BENCH("embedding", bench_embedding);
}  // namespace moetron::bench
