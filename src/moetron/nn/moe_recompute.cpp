// MoeLayer's part of activation recomputation (nn/recompute.h): what forward
// drops, how backward rebuilds it (the same kernels on the same saved
// inputs, so the rebuilt tensors equal the dropped ones), and the routing
// check of a checkpointed block's second forward.
#include <cstring>

#include "moetron/kernels/activation.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/nn/moe.h"
#include "moetron/nn/recompute.h"

namespace moetron::nn {

void MoeLayer::set_recompute(bool drop_act, bool drop_dispatch, bool drop_out) {
  drop_act_ = drop_act;
  drop_dispatch_ = drop_dispatch;
  drop_out_ = drop_out;
  if (shared_) shared_->set_drop_act(drop_act);
}

void MoeLayer::record_routing(const Tensor& topk_idx) {
  if (!recompute_pass_) {
    routing_record_ = keep_routing_ ? topk_idx : Tensor();
    return;
  }
  MOETRON_CHECK(routing_record_.defined() && routing_record_.shape() == topk_idx.shape(), prefix_,
                "block_sparse_moe: recompute pass without the first forward's routing");
  if (std::memcmp(routing_record_.raw(), topk_idx.raw(), topk_idx.nbytes()) != 0) {
    MOETRON_FAIL(
        prefix_,
        "block_sparse_moe: the recomputed forward routed tokens differently from the first "
        "forward (the recomputation is not deterministic)");
  }
  ++routing_checks_;
  routing_record_ = Tensor();
}

void MoeLayer::drop_after_forward() {
  Saved& s = saved_;
  if (drop_act_) s.act = Tensor();
  // Under expert parallelism the outputs came back from other ranks, where
  // their SwiGLU inputs live: the weights' gradient needs them here.
  if (drop_out_ && ep_size_ == 1) s.expert_out = Tensor();
  if (drop_dispatch_) {
    s.permuted = Tensor();
    if (s.x_router.raw() != s.x.raw()) s.x_router = Tensor();
  }
}

void MoeLayer::drop_input() {
  Saved& s = saved_;
  if (s.x_router.raw() == s.x.raw()) s.x_router = Tensor();
  s.x = Tensor();
  if (shared_) shared_->drop_input();
}

void MoeLayer::restore_input(const Tensor& x) {
  saved_.x = x;
  if (shared_) shared_->restore_input(x);
}

void MoeLayer::rebuild_act(kernels::Context& ctx) {
  Saved& s = saved_;
  MOETRON_CHECK(s.x.defined(), prefix_,
                "block_sparse_moe: backward without its input (norm recompute "
                "must restore it first)");
  if (s.act.defined()) return;
  const RecomputeTimer timer;
  s.act = Tensor::empty({s.gate_up.dim(0), f_}, prec_.compute);
  kernels::swiglu_forward(ctx, s.gate_up, s.act);
}

void MoeLayer::rebuild_permuted(kernels::Context& ctx) {
  Saved& s = saved_;
  if (s.permuted.defined()) return;
  const RecomputeTimer timer;
  s.permuted = dispatch(ctx, s.x);  // under expert parallelism the exchange runs again
}

void MoeLayer::rebuild_router_input(kernels::Context& ctx) {
  Saved& s = saved_;
  if (s.x_router.defined()) return;
  const RecomputeTimer timer;
  s.x_router = router_input(ctx, s.x, s.modality);
}

}  // namespace moetron::nn
