// Embedding: CPU and CUDA against the fp64 reference with vocab-parallel
// offsets, exact deterministic backward on 1 and 2 threads, finite
// differences of the reference backward, negative ids and bad shapes.
#include "moetron/kernels/embedding.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "moetron/core/rng.h"
#include "util/device_util.h"
#include "util/test_util.h"

namespace moetron::kernels {
namespace {

using test::poisoned;
using test::random_tensor;

// ids uniform in [0, hi): with hi > offset + V some ids fall on other shards.
Tensor random_ids(int64_t T, int64_t hi, const char* name) {
  Tensor ids = Tensor::empty({T}, DType::i32);
  PhiloxStream rng(99, name);
  for (int64_t t = 0; t < T; ++t) {
    ids.data<int32_t>()[t] = static_cast<int32_t>(rng.next_u32() % static_cast<uint32_t>(hi));
  }
  return ids;
}

TEST(Embedding, CpuMatchesReferenceOnVocabShards) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  const int64_t offset = 5;
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t T : test::kAwkwardSizes) {
      for (int64_t V : test::kAwkwardSizes) {
        for (int64_t D : test::kAwkwardSizes) {
          SCOPED_TRACE(testing::Message()
                       << dtype_name(dt) << " T=" << T << " V=" << V << " D=" << D);
          // ids in [0, offset + V + 3): below, inside and above this shard.
          Tensor ids = random_ids(T, offset + V + 3, "ids");
          Tensor table = random_tensor({V, D}, dt, "table");
          Tensor out = poisoned({T, D}, dt), out_ref = poisoned({T, D}, dt);
          embedding_forward(cpu, ids, table, out, offset);
          embedding_forward(ref, ids, table, out_ref, offset);
          // A gather copies: exact.
          EXPECT_TRUE(test::all_close(out, out_ref, {0, 0}));

          Tensor dout = random_tensor({T, D}, dt, "dout");
          Tensor dtable = random_tensor({V, D}, DType::f32, "dtable0");  // accumulates
          Tensor dtable_ref = dtable.clone();
          embedding_backward(cpu, ids, dout, dtable, offset);
          embedding_backward(ref, ids, dout, dtable_ref, offset);
          // Both add in token order with one fp32 rounding per addition: exact.
          EXPECT_TRUE(test::all_close(dtable, dtable_ref, {0, 0}));
        }
      }
    }
  }
}

// The CUDA backward adds each row's tokens in token order like the CPU and
// the reference: exact too. T 4000 over V 300 repeats rows many times.
TEST(Embedding, CudaMatchesReferenceOnVocabShards) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda), ref(Backend::reference);
  const auto dev = [&](const Tensor& t) { return test::on_device(gpu, t); };
  const int64_t offset = 5;
  std::vector<int64_t> rows = test::kAwkwardSizes;
  rows.push_back(4000);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (int64_t T : rows) {
      for (int64_t V : {int64_t{1}, int64_t{7}, int64_t{300}}) {
        for (int64_t D : {int64_t{1}, int64_t{33}, int64_t{300}}) {
          SCOPED_TRACE(testing::Message()
                       << dtype_name(dt) << " T=" << T << " V=" << V << " D=" << D);
          Tensor ids = random_ids(T, offset + V + 3, "ids");
          Tensor table = random_tensor({V, D}, dt, "table");
          Tensor out = dev(poisoned({T, D}, dt)), out_ref = poisoned({T, D}, dt);
          embedding_forward(gpu, dev(ids), dev(table), out, offset);
          embedding_forward(ref, ids, table, out_ref, offset);
          EXPECT_TRUE(test::all_close(test::on_host(out), out_ref, {0, 0}));

          Tensor dout = random_tensor({T, D}, dt, "dout");
          Tensor dtable_ref = random_tensor({V, D}, DType::f32, "dtable0");  // accumulates
          Tensor dtable = dev(dtable_ref.clone());
          embedding_backward(gpu, dev(ids), dev(dout), dtable, offset);
          embedding_backward(ref, ids, dout, dtable_ref, offset);
          EXPECT_TRUE(test::all_close(test::on_host(dtable), dtable_ref, {0, 0}));
        }
      }
    }
  }
}

TEST(Embedding, CudaNegativeIdIsAnErrorNamingTheToken) {
  MOETRON_SKIP_WITHOUT_GPU();
  Context gpu(Backend::cuda);
  Tensor ids = Tensor::empty({5}, DType::i32);
  const int32_t id_values[5] = {0, 1, -2, -7, 3};
  std::memcpy(ids.raw(), id_values, sizeof(id_values));
  Tensor table = test::on_device(gpu, Tensor::zeros({4, 2}, DType::f32));
  Tensor out = test::on_device(gpu, Tensor::zeros({5, 2}, DType::f32));
  const Tensor ids_dev = test::on_device(gpu, ids);
  try {
    embedding_forward(gpu, ids_dev, table, out, 0);
    ADD_FAILURE() << "negative id accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 2 has negative id -2"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(embedding_backward(gpu, ids_dev, out, table, 0), Error);
}

TEST(Embedding, BackwardIsIdenticalOnOneAndTwoThreads) {
  const int64_t T = 4000, V = 300, D = 33;
  Tensor ids = random_ids(T, V, "ids_det");  // many repeats per row
  Tensor dout = random_tensor({T, D}, DType::f32, "dout");
  Tensor d1 = Tensor::zeros({V, D}, DType::f32), d2 = Tensor::zeros({V, D}, DType::f32);
  {
    Context one(Backend::cpu, 1);
    embedding_backward(one, ids, dout, d1, 0);
  }
  {
    Context two(Backend::cpu, 2);
    embedding_backward(two, ids, dout, d2, 0);
  }
  EXPECT_EQ(std::memcmp(d1.raw(), d2.raw(), d1.nbytes()), 0);
}

TEST(Embedding, ReferenceBackwardMatchesFiniteDifferences) {
  Context ref(Backend::reference);
  const int64_t T = 6, V = 4, D = 3;
  Tensor ids = Tensor::empty({T}, DType::i32);
  const int32_t id_values[T] = {2, 3, 2, 9, 4, 2};  // offset 1: rows 1, 2, 1, -, 3, 1
  std::memcpy(ids.raw(), id_values, sizeof(id_values));
  Tensor table = random_tensor({V, D}, DType::f64, "fd_table");
  Tensor weights = random_tensor({T, D}, DType::f64, "fd_weights");
  Tensor out = Tensor::empty({T, D}, DType::f64);
  auto loss = [&] {
    embedding_forward(ref, ids, table, out, 1);
    double s = 0;
    for (int64_t i = 0; i < out.numel(); ++i)
      s += out.data<double>()[i] * weights.data<double>()[i];
    return s;
  };
  Tensor dtable = Tensor::zeros({V, D}, DType::f64);
  embedding_backward(ref, ids, weights, dtable, 1);
  EXPECT_TRUE(test::finite_difference_check(loss, table, dtable));
}

TEST(Embedding, NegativeIdIsAnErrorNamingTheToken) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  Tensor ids = Tensor::empty({5}, DType::i32);
  const int32_t id_values[5] = {0, 1, 2, -7, 3};
  std::memcpy(ids.raw(), id_values, sizeof(id_values));
  Tensor table = Tensor::zeros({4, 2}, DType::f32), out = Tensor::zeros({5, 2}, DType::f32);
  for (Context* ctx : {&cpu, &ref}) {
    try {
      embedding_forward(*ctx, ids, table, out, 0);
      ADD_FAILURE() << "negative id accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("token 3"), std::string::npos) << e.what();
    }
    EXPECT_THROW(embedding_backward(*ctx, ids, out, table, 0), Error);
  }
}

TEST(Embedding, BadInputsAreErrors) {
  Context cpu(Backend::cpu), ref(Backend::reference);
  Tensor ids = random_ids(5, 4, "ids_bad");
  Tensor table = Tensor::zeros({4, 2}, DType::f32), out = Tensor::zeros({5, 2}, DType::f32);
  for (Context* ctx : {&cpu, &ref}) {
    EXPECT_THROW(embedding_forward(*ctx, ids, table, Tensor::zeros({5, 3}, DType::f32), 0), Error);
    EXPECT_THROW(embedding_forward(*ctx, ids, table, Tensor::zeros({5, 2}, DType::bf16), 0), Error);
    EXPECT_THROW(embedding_forward(*ctx, ids, table.reshape({8}), out, 0), Error);
    EXPECT_THROW(embedding_forward(*ctx, Tensor::zeros({5}, DType::f32), table, out, 0), Error);
    EXPECT_THROW(embedding_forward(*ctx, ids, table, out, -1), Error);
    EXPECT_THROW(embedding_backward(*ctx, ids, Tensor::zeros({4, 2}, DType::f32), table, 0), Error);
  }
  // The CPU backend accumulates the table gradient in f32 only.
  EXPECT_THROW(embedding_backward(cpu, ids, out, Tensor::zeros({4, 2}, DType::bf16), 0), Error);
}

}  // namespace
}  // namespace moetron::kernels
