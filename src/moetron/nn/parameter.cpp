#include "moetron/nn/parameter.h"

#include <cstring>

#include "moetron/core/rng.h"

namespace moetron::nn {

Parameter& ParameterSet::add(std::string name, const Shape& shape, DType dtype, DType grad_dtype,
                             ParallelKind kind, InitKind init, float init_std, bool hidden_matrix) {
  return add_view(std::move(name), Tensor::empty(shape, dtype, MemTag::params),
                  Tensor::zeros(shape, grad_dtype, MemTag::grads), kind, init, init_std,
                  hidden_matrix);
}

Parameter& ParameterSet::add_view(std::string name, Tensor value, Tensor grad, ParallelKind kind,
                                  InitKind init, float init_std, bool hidden_matrix) {
  for (const auto& p : params_) {
    MOETRON_CHECK(p->name != name, "parameter '", name, "' registered twice");
  }
  MOETRON_CHECK(value.shape() == grad.shape(), "parameter '", name, "': value ", value.str(),
                " and grad ", grad.str(), " differ in shape");
  auto p = std::make_unique<Parameter>();
  p->name = std::move(name);
  p->value = std::move(value);
  p->grad = std::move(grad);
  p->kind = kind;
  p->init = init;
  p->init_std = init_std;
  p->hidden_matrix = hidden_matrix;
  params_.push_back(std::move(p));
  return *params_.back();
}

void ParameterSet::initialize(uint64_t seed) {
  for (auto& p : params_) {
    switch (p->init) {
      case InitKind::normal:
        if (p->sharded()) {
          // Element (r, c) of the full tensor draws the same number on every layout.
          const int64_t cols = p->shard.full.rank() == 2 ? p->shard.full[1] : 1;
          Tensor block = p->value.reshape({p->value.dim(0), p->value.numel() / p->value.dim(0)});
          fill_normal_block(block, seed, p->name, 0.0f, p->init_std, cols, p->shard.row0,
                            p->shard.col0);
        } else {
          fill_normal(p->value, seed, p->name, 0.0f, p->init_std);
        }
        break;
      case InitKind::ones:
        p->value.fill(1.0);
        break;
      case InitKind::zeros:
        p->value.fill(0.0);
        break;
    }
  }
}

void ParameterSet::zero_grads() {
  for (auto& p : params_) {
    if (p->grad.nbytes()) std::memset(p->grad.raw(), 0, p->grad.nbytes());
  }
}

void ParameterSet::set_shard(Parameter& p, const Shape& full, int64_t row0, int64_t col0) {
  MOETRON_CHECK(full.rank() == p.value.rank() && p.value.rank() >= 1 && p.value.rank() <= 2,
                "parameter '", p.name, "': shard ", p.value.str(), " of ", full.str());
  MOETRON_CHECK(row0 >= 0 && row0 + p.value.dim(0) <= full[0] &&
                    (full.rank() == 1 || (col0 >= 0 && col0 + p.value.dim(1) <= full[1])),
                "parameter '", p.name, "': block at (", row0, ", ", col0, ") of ", p.value.str(),
                " outside ", full.str());
  p.shard.full = full;
  p.shard.row0 = row0;
  p.shard.col0 = col0;
}

Parameter& ParameterSet::get(const std::string& name) {
  Parameter* p = find(name);
  MOETRON_CHECK(p, "no parameter named '", name, "'");
  return *p;
}

Parameter* ParameterSet::find(const std::string& name) const {
  for (const auto& p : params_) {
    if (p->name == name) return p.get();
  }
  return nullptr;
}

int64_t ParameterSet::numel() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p->value.numel();
  return n;
}

}  // namespace moetron::nn
