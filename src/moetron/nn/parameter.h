// Parameters: named (by their global Hugging Face name), initialised from the
// seed and that name (never from a rank), with a working copy in the compute
// dtype and an accumulated gradient. A parameter knows how it would be split
// under tensor/expert parallelism, so layouts can shard it later.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "moetron/core/tensor.h"

namespace moetron::nn {

// How a tensor-parallel layout splits the parameter (Megatron terms).
enum class ParallelKind {
  replicated,  // norms, router
  column,      // split along dim 0 (out features): q/k/v, gate/up
  row,         // split along dim 1 (in features): o, down
  vocab,       // embedding / LM head rows
  expert,      // one routed expert's matrix: expert parallelism places whole experts
};

enum class InitKind { normal, ones, zeros };

// Numeric setup of a model instance. compute: dtype of activations and of the
// weights' working copies (f32, bf16, or f64 for the reference-backend
// gradient checks). accum: dtype of gradients, norms' weights, the router and
// softmax statistics (f32, or f64 with compute f64).
//
// bf16_matrix_grads (train.grad_dtype = "bf16", with compute bf16): the
// gradients of the hidden matrices (attention q/k/v/o, dense and shared
// SwiGLU, routed experts) are stored in bf16 (half their bytes; each
// backward GEMM accumulates in fp32 and rounds once into them). Embeddings,
// head, norms and router keep accum gradients.
struct Precision {
  DType compute = DType::f32;
  DType accum = DType::f32;
  bool bf16_matrix_grads = false;
  // The dtype of the hidden matrices' gradients: accum unless bf16_matrix_grads.
  DType matrix_grad() const { return bf16_matrix_grads ? DType::bf16 : accum; }
  static Precision fp32() { return {DType::f32, DType::f32}; }
  static Precision bf16() { return {DType::bf16, DType::f32}; }
  // fp16 storage, fp32 math on CPUs (see kernels/f16_staging.h); needs loss scaling.
  static Precision fp16() { return {DType::f16, DType::f32}; }
  static Precision fp64() { return {DType::f64, DType::f64}; }
};

struct Parameter {
  std::string name;  // e.g. "model.layers.0.self_attn.q_proj.weight"
  Tensor value;      // working copy used by the kernels
  Tensor grad;  // dtype Precision::accum (hidden matrices: matrix_grad()), accumulated by backward
  ParallelKind kind = ParallelKind::replicated;
  InitKind init = InitKind::normal;
  float init_std = 0.02f;
  // 2-D hidden matrix (attention, experts, dense FFN): the matrices Muon
  // orthogonalises. Embeddings, head, norms and router are not.
  bool hidden_matrix = false;
  int64_t expert =
      -1;  // the routed expert this matrix belongs to (expert parallelism shards whole experts)
  // Tensor parallelism (nn/tensor_parallel.h): this rank holds the block
  // [row0, row0 + rows) x [col0, col0 + cols) of a tensor of shape `full`
  // (rank 0: the whole tensor). Initialisation, checkpoints and Muon's
  // orthogonalisation work on the full tensor.
  struct Shard {
    Shape full;
    int64_t row0 = 0, col0 = 0;
    // Whether this rank is the first of the tp ranks holding this same block
    // (several do for kv heads replicated over tp): sums over tp count it once.
    bool primary = true;
  } shard;
  bool sharded() const { return shard.full.rank() > 0; }
  // The tp ranks computed this gradient from different tokens (the MoE's
  // router and shared experts; norms under sequence parallelism), so it is
  // reduced over dp x tp rather than dp alone.
  bool grad_partial_over_tp = false;
};

class ParameterSet {
 public:
  // Allocates value (dtype, tag params) and grad (accum dtype, tag grads).
  Parameter& add(std::string name, const Shape& shape, DType dtype, DType grad_dtype,
                 ParallelKind kind, InitKind init, float init_std, bool hidden_matrix);
  // Initialises every value from (seed, name): identical on every layout.
  // Registers views into a buffer the caller owns (e.g. w1 and w3 of an expert
  // living in one fused [2F, D] gate-up matrix, so one GEMM computes both).
  Parameter& add_view(std::string name, Tensor value, Tensor grad, ParallelKind kind, InitKind init,
                      float init_std, bool hidden_matrix);
  void initialize(uint64_t seed);
  void zero_grads();
  // Marks `p` as the block [row0, ...) x [col0, ...) of a tensor of shape `full`.
  static void set_shard(Parameter& p, const Shape& full, int64_t row0, int64_t col0);
  Parameter& get(const std::string& name);
  Parameter* find(const std::string& name) const;  // nullptr when absent
  const std::vector<std::unique_ptr<Parameter>>& all() const { return params_; }
  int64_t numel() const;

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
};

}  // namespace moetron::nn
