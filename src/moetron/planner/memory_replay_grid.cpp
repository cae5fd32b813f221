#include "moetron/planner/memory_replay_grid.h"

#include "moetron/nn/model_config.h"

namespace moetron::planner {

std::vector<GridWeightsReplay::Weight> GridWeightsReplay::block(int64_t layer) const {
  if (x_.grid_rows <= 1) return {};
  const Dims& x = x_;
  // q, k, v, o (nn/attention.cpp), then a dense layer's gate-up and down (nn/mlp.cpp).
  std::vector<Weight> w = {{x.h * x.hd, x.d, 1, true},
                           {x.hkv * x.hd, x.d, 1, true},
                           {x.hkv * x.hd, x.d, 1, true},
                           {x.d, x.h * x.hd, 1, true}};
  if (!nn::layer_is_moe(in_.moe, layer)) {
    w.push_back({2 * x.ffn, x.d, 2, true});
    w.push_back({x.d, x.ffn, 1, true});
  }
  return w;
}

std::vector<GridWeightsReplay::Weight> GridWeightsReplay::vocab() const {
  if (x_.grid_rows <= 1) return {};
  return {{x_.v, x_.d, 1, false}};
}

std::vector<Buf> GridWeightsReplay::gather(const std::vector<Weight>& weights, bool values,
                                           bool grads) {
  std::vector<Buf> held;
  for (const Weight& w : weights) {
    if (values) held.push_back(r_.ws(w.rows * w.cols, x_.c));
    if (grads) held.push_back(r_.ws(w.rows * w.cols, grad_dtype(w)));
  }
  return held;
}

void GridWeightsReplay::finish(const std::vector<Weight>& weights, std::vector<Buf>& held) {
  if (held.empty()) return;
  for (const Weight& w : weights) {
    const int64_t part = w.rows / w.parts / x_.grid_rows * w.cols;
    for (int64_t p = 0; p < w.parts; ++p) Buf sum = r_.alloc(part, grad_dtype(w), MemTag::comm);
  }
  held.clear();
}

}  // namespace moetron::planner
