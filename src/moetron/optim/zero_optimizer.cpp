#include "moetron/optim/zero_optimizer.h"

#include <algorithm>
#include <cmath>

#include "moetron/kernels/adamw.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/optim/newton_schulz.h"
#include "moetron/parallel/bucket_plan.h"

namespace moetron::optim {

ZeroOptimizer::ZeroOptimizer(nn::ParameterSet& /*params*/, OptimizerOptions opts,
                             parallel::GradReducer& reducer, bool redundant_newton_schulz)
    : opts_(std::move(opts)), reducer_(reducer), redundant_(redundant_newton_schulz) {
  MOETRON_CHECK(opts_.name == "adamw" || opts_.name == "muon",
                "optim.name must be adamw or muon, got '", opts_.name, "'");
  MOETRON_CHECK(opts_.moment_dtype == DType::f32 || opts_.moment_dtype == DType::bf16,
                "optim.moment_dtype must be fp32 or bf16, got ", dtype_name(opts_.moment_dtype));
  MOETRON_CHECK(opts_.moment_dtype != DType::u8,
                "optim.moment_dtype = int8 is not built for parallel.zero");
  MOETRON_CHECK(opts_.master_dtype == DType::f32,
                "optim.master_dtype = bf16 is not built for parallel.zero (ZeRO-1 keeps fp32 "
                "master chunks)");
  MOETRON_CHECK(reducer_.options().mode == parallel::ReduceMode::reduce_scatter,
                "the ZeRO-1 optimizer needs a reduce-scatter gradient reducer");
  const int64_t rank = reducer_.comm().rank();
  for (size_t bi = 0; bi < reducer_.buckets().size(); ++bi) {
    for (const parallel::BucketSlot& slot : reducer_.buckets()[bi].slots)
      bucket_of_[slot.param] = bi;
  }
  kernels::Context conv(kernels::Backend::reference);
  for (const parallel::Bucket& b : reducer_.buckets()) {
    Shard sh;
    const int64_t lo = rank * b.chunk, hi = lo + b.chunk;
    DType value_dtype = DType::f32;
    bool any_muon = false;
    for (const parallel::BucketSlot& slot : b.slots) {
      value_dtype = slot.param->value.dtype();
      const int64_t a = std::max(lo, slot.offset), e = std::min(hi, slot.offset + slot.numel);
      if (a >= e) continue;
      Segment sg{slot.param,
                 a - slot.offset,
                 e - a,
                 a - lo,
                 rule_uses_muon(opts_, *slot.param),
                 rule_decays(opts_, *slot.param)};
      any_muon |= sg.muon;
      sh.segments.push_back(sg);
    }
    // The working copies travel in their own dtype when the bucket has one
    // (bf16 halves the all-gather), in fp32 when it mixes them (norms stay fp32).
    for (const parallel::BucketSlot& slot : b.slots) {
      if (slot.param->value.dtype() != value_dtype) value_dtype = DType::f32;
      any_muon |= rule_uses_muon(opts_, *slot.param);
    }
    sh.master = Tensor::zeros({b.chunk}, DType::f32, MemTag::optimizer);
    const DType moments = moment_storage(opts_, DType::f32);
    sh.m = Tensor::zeros({b.chunk}, moments, MemTag::optimizer);
    std::vector<std::pair<int64_t, int64_t>> adamw;
    for (const parallel::BucketSlot& slot : b.slots) {
      if (!rule_uses_muon(opts_, *slot.param)) adamw.emplace_back(slot.offset, slot.numel);
    }
    const int64_t v_len = parallel::max_chunk_share(adamw, b.chunk, reducer_.comm().size());
    if (v_len > 0) sh.v = Tensor::zeros({v_len}, moments, MemTag::optimizer);
    int64_t v_at = 0;
    for (Segment& sg : sh.segments) {
      if (sg.muon) continue;
      sg.v_lo = v_at;
      v_at += sg.len;
    }
    for (const Segment& sg : sh.segments) {
      const Tensor src = sg.param->value.reshape({sg.param->value.numel()})
                             .slice(sg.param_lo, sg.param_lo + sg.len);
      kernels::convert(conv, src, sh.master.slice(sg.chunk_lo, sg.chunk_lo + sg.len));
    }
    sh.values_own = Tensor::zeros({b.chunk}, value_dtype, MemTag::comm);
    sh.values_full = Tensor::zeros({b.numel}, value_dtype, MemTag::comm);
    if (any_muon) {
      sh.u_own = Tensor::zeros({b.chunk}, DType::f32, MemTag::comm);
      // A matrix cut by a chunk boundary is orthogonalised from the gathered
      // update (every rank holding part of it); a matrix inside one chunk
      // (the owner plan) by its owner alone, with nothing gathered.
      for (const parallel::BucketSlot& slot : b.slots) {
        if (rule_uses_muon(opts_, *slot.param) &&
            slot.offset / b.chunk != (slot.offset + slot.numel - 1) / b.chunk) {
          sh.gather_u = true;
        }
      }
      if (redundant_) sh.gather_u = true;
      if (sh.gather_u) sh.u_full = Tensor::zeros({b.numel}, DType::f32, MemTag::comm);
    }
    shards_.push_back(std::move(sh));
  }
}

ZeroOptimizer::GradSquares ZeroOptimizer::grad_squares(kernels::Context& ctx) {
  Tensor sq = Tensor::zeros({2}, DType::f64, MemTag::comm);
  double* s = sq.data<double>();
  const bool tp = tp_ && tp_->on();
  const auto& buckets = reducer_.buckets();
  for (size_t bi = 0; bi < buckets.size(); ++bi) {
    for (const Segment& sg : shards_[bi].segments) {
      const bool block = tp && sg.param->sharded();
      if (block && !sg.param->shard.primary) continue;
      s[block ? 1 : 0] +=
          kernels::sum_squares(ctx, buckets[bi].shard.slice(sg.chunk_lo, sg.chunk_lo + sg.len));
    }
  }
  // Without tp there are no blocks: one value on the wire.
  reducer_.comm().allreduce(tp ? sq : sq.slice(0, 1), comm::ReduceOp::sum);
  return {s[0], s[1]};
}

double ZeroOptimizer::grad_norm(kernels::Context& ctx, double grad_scale) {
  const GradSquares sq = grad_squares(ctx);
  return std::sqrt(sq.replicated + sq.blocks) * std::fabs(grad_scale);
}

void ZeroOptimizer::set_tensor_parallel(const nn::TensorParallel* tp) {
  tp_ = tp;
  if (!tp_ || !tp_->on()) return;
  MOETRON_CHECK(tp_->group, "ZeRO-1 under tensor parallelism needs the tp group");
  // The Muon gathers pair the ranks updating the same block on every tp
  // rank: they exist only if every tp rank cut the same buckets.
  uint64_t h = 1469598103934665603ull;
  const auto mix = [&h](int64_t v) { h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
  for (const parallel::Bucket& b : reducer_.buckets()) {
    mix(b.numel);
    mix(b.chunk);
    for (const parallel::BucketSlot& slot : b.slots) {
      mix(slot.offset);
      mix(slot.numel);
      mix(rule_uses_muon(opts_, *slot.param));
    }
  }
  Tensor v = Tensor::empty({2}, DType::i64, MemTag::comm);
  v.data<int64_t>()[0] = static_cast<int64_t>(h >> 1);
  v.data<int64_t>()[1] = -static_cast<int64_t>(h >> 1);
  tp_->group->allreduce(v, comm::ReduceOp::max);
  MOETRON_CHECK(v.data<int64_t>()[0] == -v.data<int64_t>()[1],
                "ZeRO-1 under tensor parallelism: the tp ranks cut different gradient buckets "
                "(parallel.bucket_mb and the parameter shapes must agree over tp)");
}

void ZeroOptimizer::adamw_segment(kernels::Context& ctx, Shard& sh, const Tensor& grad,
                                  const Segment& sg, double lr, double mult, int64_t step) {
  const kernels::AdamWArgs a = adamw_args(opts_, sg.decay, step, lr, mult);
  const int64_t lo = sg.chunk_lo, hi = sg.chunk_lo + sg.len;
  const Tensor values = sh.values_own.slice(lo, hi);
  const bool fused_copy = values.dtype() != DType::f16;
  kernels::adamw_step(ctx, sh.master.slice(lo, hi), grad.slice(lo, hi), sh.m.slice(lo, hi),
                      sh.v.slice(sg.v_lo, sg.v_lo + sg.len), a, fused_copy ? values : Tensor());
  if (!fused_copy) kernels::convert(ctx, sh.master.slice(lo, hi), values);
}

StepInfo ZeroOptimizer::step(kernels::Context& ctx, int64_t step, double grad_scale,
                             double known_norm) {
  finish_gathers();  // values_own is about to change
  StepInfo info;
  info.lr = opts_.schedule.at(step);
  info.grad_norm = known_norm >= 0 ? known_norm : grad_norm(ctx, grad_scale);
  if (opts_.grad_clip > 0 && info.grad_norm > opts_.grad_clip) {
    info.clip_coef = opts_.grad_clip / (info.grad_norm + 1e-6);
  }
  const double mult = grad_scale * info.clip_coef;
  const auto beta = static_cast<float>(opts_.muon_momentum);
  const auto g_mult = static_cast<float>((1.0 - beta) * mult);
  comm::Communicator& dp = reducer_.comm();
  const auto& buckets = reducer_.buckets();
  for (size_t bi = 0; bi < buckets.size(); ++bi) {
    const parallel::Bucket& b = buckets[bi];
    Shard& sh = shards_[bi];
    for (const Segment& sg : sh.segments) {
      if (!sg.muon) {
        adamw_segment(ctx, sh, b.shard, sg, info.lr, mult, step);
        continue;
      }
      // The one-rank Muon's momentum and Nesterov steps, on this slice (a
      // bf16 momentum widened into fp32, updated there, rounded back once).
      const int64_t lo = sg.chunk_lo, hi = sg.chunk_lo + sg.len;
      const Tensor stored = sh.m.slice(lo, hi), g = b.shard.slice(lo, hi),
                   u = sh.u_own.slice(lo, hi);
      const bool narrow = stored.dtype() != DType::f32;
      Tensor m = stored;
      if (narrow) {
        m = Tensor::empty({sg.len}, DType::f32, MemTag::workspace);
        kernels::convert(ctx, stored, m);
      }
      kernels::scale(ctx, m, beta, m);
      kernels::axpy(ctx, g_mult, g, m);
      if (opts_.muon_nesterov) {
        kernels::scale(ctx, m, beta, u);
        kernels::axpy(ctx, g_mult, g, u);
      } else {
        u.copy_from(m);
      }
      if (narrow) kernels::convert(ctx, m, stored);
    }
    if (!sh.u_own.defined()) continue;
    if (sh.gather_u) dp.allgather(sh.u_own, sh.u_full);
    for (const parallel::BucketSlot& slot : b.slots) {
      if (!rule_uses_muon(opts_, *slot.param)) continue;
      // Only ranks holding part of this matrix need its orthogonalisation.
      std::vector<const Segment*> mine;
      for (const Segment& sg : sh.segments) {
        if (sg.param == slot.param) mine.push_back(&sg);
      }
      if (mine.empty() && !redundant_) continue;
      const Shape& shape = slot.param->value.shape();
      const bool whole = !sh.gather_u && mine.size() == 1 && mine[0]->len == slot.numel;
      const Tensor u_full =
          whole ? sh.u_own.slice(mine[0]->chunk_lo, mine[0]->chunk_lo + slot.numel).reshape(shape)
                : sh.u_full.slice(slot.offset, slot.offset + slot.numel).reshape(shape);
      Tensor o = Tensor::empty(shape, DType::f32, MemTag::workspace);
      const bool tp_block = tp_ && tp_->on() && slot.param->sharded();
      if (tp_block) {  // the whole matrix from every tp rank's block (collective over tp)
        const Tensor u_all = nn::gather_shards(*tp_, *slot.param, u_full);
        Tensor o_all = Tensor::empty(u_all.shape(), DType::f32, MemTag::workspace);
        newton_schulz(ctx, u_all, o_all, opts_.muon_ns_steps);
        nn::copy_shard(*slot.param, o_all, o);
      } else {
        newton_schulz(ctx, u_full, o, opts_.muon_ns_steps);
      }
      const Tensor o_flat = o.reshape({slot.numel});
      const Shape& whole_shape = tp_block ? slot.param->shard.full : shape;
      const double rms = muon_rms_scale(whole_shape[0], whole_shape[1]);
      for (const Segment* sg : mine) {
        const int64_t lo = sg->chunk_lo, hi = sg->chunk_lo + sg->len;
        const Tensor master = sh.master.slice(lo, hi);
        if (sg->decay && opts_.weight_decay > 0) {
          kernels::scale(ctx, master, static_cast<float>(1.0 - info.lr * opts_.weight_decay),
                         master);
        }
        kernels::axpy(ctx, static_cast<float>(-info.lr * rms),
                      o_flat.slice(sg->param_lo, sg->param_lo + sg->len), master);
        kernels::convert(ctx, master, sh.values_own.slice(lo, hi));
      }
    }
  }
  // Every rank gets the whole updated working copy back. Buckets run from
  // the head to the embedding (backward order): start the embedding's first,
  // the order the next forward needs them.
  gather_ctx_ = &ctx;
  gathers_.resize(buckets.size());
  for (size_t bi = buckets.size(); bi-- > 0;) {
    gathers_[bi] = dp.allgather_async(shards_[bi].values_own, shards_[bi].values_full);
  }
  if (!overlap_gather_) finish_gathers();
  return info;
}

void ZeroOptimizer::finish_gather(size_t bi) {
  if (bi >= gathers_.size() || !gathers_[bi]) return;
  gathers_[bi]->wait();
  gathers_[bi].reset();
  const Shard& sh = shards_[bi];
  kernels::Context fallback(kernels::Backend::cpu);
  kernels::Context& ctx = gather_ctx_ ? *gather_ctx_ : fallback;
  for (const parallel::BucketSlot& slot : reducer_.buckets()[bi].slots) {
    const Tensor src = sh.values_full.slice(slot.offset, slot.offset + slot.numel);
    const Tensor dst = slot.param->value.reshape({slot.numel});
    if (src.dtype() == dst.dtype()) {
      dst.copy_from(src);
    } else {
      kernels::convert(ctx, src, dst);
    }
  }
}

void ZeroOptimizer::finish_gathers() {
  for (size_t bi = gathers_.size(); bi-- > 0;) finish_gather(bi);
}

bool ZeroOptimizer::holds(const std::string& param_name) const {
  for (const auto& [p, bucket] : bucket_of_) {
    if (p->name == param_name) return true;
  }
  return false;
}

void ZeroOptimizer::wait_for(const nn::Parameter& p) {
  const auto it = bucket_of_.find(&p);
  if (it != bucket_of_.end()) finish_gather(it->second);
  reducer_.comm().poll();  // the later buckets progress meanwhile
}

// This rank's pieces of a chunked tensor (momenta, moments or masters), one
// per segment: a range of the parameter, or of its tp block under tp.
std::vector<StateSlice> ZeroOptimizer::segment_slices(
    const std::function<void(const Shard&, const Segment&, std::vector<StateSlice>&, StateSlice)>&
        add) {
  finish_gathers();
  std::vector<StateSlice> out;
  for (const Shard& sh : shards_) {
    for (const Segment& sg : sh.segments) {
      // Under tp: a range of this rank's block of the full tensor; every tp
      // rank's dp group holds the tensors not sharded over tp (stored by tp rank 0).
      const bool block = tp_ && tp_->on() && sg.param->sharded();
      StateSlice base;
      base.offset = sg.param_lo;
      base.total = block ? sg.param->shard.full.numel() : sg.param->value.numel();
      base.duplicate = tp_ && tp_->on() && (block ? !sg.param->shard.primary : tp_->rank != 0);
      base.block_of = block ? sg.param : nullptr;
      add(sh, sg, out, base);
    }
  }
  return out;
}

std::vector<StateSlice> ZeroOptimizer::state_slices() {
  return segment_slices(
      [](const Shard& sh, const Segment& sg, std::vector<StateSlice>& out, StateSlice base) {
        const int64_t lo = sg.chunk_lo, hi = sg.chunk_lo + sg.len;
        StateSlice m = base;
        m.name = sg.param->name + (sg.muon ? ".momentum" : ".exp_avg");
        m.values = sh.m.slice(lo, hi);
        out.push_back(std::move(m));
        if (!sg.muon) {
          base.name = sg.param->name + ".exp_avg_sq";
          base.values = sh.v.slice(sg.v_lo, sg.v_lo + sg.len);
          out.push_back(std::move(base));
        }
      });
}

std::vector<StateSlice> ZeroOptimizer::checkpoint_masters() {
  return segment_slices(
      [](const Shard& sh, const Segment& sg, std::vector<StateSlice>& out, StateSlice base) {
        base.name = sg.param->name;
        base.values = sh.master.slice(sg.chunk_lo, sg.chunk_lo + sg.len);
        out.push_back(std::move(base));
      });
}

void ZeroOptimizer::load_master(const std::string& param_name, const Tensor& full) {
  finish_gathers();
  kernels::Context conv(kernels::Backend::reference);
  bool found = false;
  for (const parallel::Bucket& b : reducer_.buckets()) {
    for (const parallel::BucketSlot& slot : b.slots) {
      if (slot.param->name != param_name) continue;
      check_shape(full, param_name.c_str(), slot.param->value.shape());
      kernels::convert(conv, full, slot.param->value);
      found = true;
    }
  }
  MOETRON_CHECK(found, "optimizer has no parameter '", param_name, "'");
  const Tensor flat = full.reshape({full.numel()});
  for (Shard& sh : shards_) {
    for (const Segment& sg : sh.segments) {
      if (sg.param->name != param_name) continue;
      kernels::convert(conv, flat.slice(sg.param_lo, sg.param_lo + sg.len),
                       sh.master.slice(sg.chunk_lo, sg.chunk_lo + sg.len));
    }
  }
}

}  // namespace moetron::optim
