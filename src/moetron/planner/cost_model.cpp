#include "moetron/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "moetron/core/error.h"
#include "moetron/nn/flops.h"
#include "moetron/parallel/pipeline_schedule.h"

namespace moetron::planner {

namespace {

constexpr double kBf16 = 2, kF32 = 4;
// Bytes the AdamW update moves per parameter: reads master, gradient and two
// moments (16), writes master and moments (12) and the bf16 weight (2).
constexpr double kOptimizerBytesPerParam = 30;
constexpr double kBucketBytes = 16 << 20;  // gradient buckets: one latency each
constexpr double kMemoryHeadroom = 0.9;    // of a device's memory a plan may fill

double alltoall_s(double bytes, int64_t n, const Link& l) {
  if (n <= 1) return 0;
  const double k = static_cast<double>(n - 1);
  return k * l.latency + k / static_cast<double>(n) * bytes / l.bandwidth;
}
double wire_allreduce(double bytes, int64_t n) {
  return n <= 1 ? 0 : 2.0 * static_cast<double>(n - 1) / static_cast<double>(n) * bytes;
}

}  // namespace

double allreduce_seconds(double bytes, int64_t n, const Link& l) {
  if (n <= 1) return 0;
  const double k = static_cast<double>(n - 1);
  return 2 * k * l.latency + 2 * k / static_cast<double>(n) * bytes / l.bandwidth;
}

double allgather_seconds(double bytes, int64_t n, const Link& l) {
  return allreduce_seconds(bytes, n, l) / 2;
}

int64_t grid_side(int64_t tp) {
  int64_t q = 1;
  while ((q + 1) * (q + 1) <= tp) ++q;
  return q * q == tp ? q : 0;
}

std::string LayoutChoice::str() const {
  std::string s = "dp=" + std::to_string(dp);
  s += ",tp=" + std::to_string(tp);
  s += ",pp=" + std::to_string(pp);
  s += ",ep=" + std::to_string(ep);
  s += ",cp=" + std::to_string(cp);
  s += ",vpp=" + std::to_string(vpp);
  s += ",mb=" + std::to_string(micro_batch);
  s += ",recompute=" + recompute;
  if (tp_2d) s += ",tp2d";
  if (zero3) {
    s += ",zero3";
  } else if (zero1) {
    s += ",zero1";
  }
  if (offload) s += ",offload";
  return s;
}

double pipelined_seconds(const StepCost& c) {
  return c.compute_s + c.elementwise_s + c.tp_comm_s + c.ep_comm_s + c.cp_comm_s + c.pp_comm_s;
}

std::string StepCost::dominant() const {
  const std::pair<const char*, double> terms[] = {
      {"compute", compute_s}, {"bubble", bubble_s},       {"pp", pp_comm_s},
      {"tp", tp_comm_s},      {"ep", ep_comm_s},          {"cp", cp_comm_s},
      {"dp", dp_comm_s},      {"optimizer", optimizer_s}, {"elementwise", elementwise_s}};
  return std::max_element(std::begin(terms), std::end(terms),
                          [](const auto& a, const auto& b) { return a.second < b.second; })
      ->first;
}

CostModel::CostModel(Workload w, HardwareProfile hw) : w_(std::move(w)), hw_(std::move(hw)) {
  const nn::ModelConfig& m = w_.model;
  const nn::MoeConfig& e = w_.moe;
  MOETRON_CHECK(w_.seq_len > 0 && w_.global_batch > 0, "cost model: seq_len and global_batch > 0");
  const double d = static_cast<double>(m.d_model), hd = static_cast<double>(m.resolved_head_dim());
  const double q = static_cast<double>(m.n_heads) * hd, kv = static_cast<double>(m.n_kv_heads) * hd;
  const double eh = static_cast<double>(e.expert_hidden), k = static_cast<double>(e.top_k);
  const double sh =
      static_cast<double>(e.shared_expert_hidden > 0 ? e.shared_expert_hidden : e.expert_hidden);
  const double S = static_cast<double>(w_.seq_len);
  dense_params_ = static_cast<double>(m.vocab_size) * d * (m.tie_embeddings ? 1 : 2) + d;
  double activations = 0;
  for (int64_t i = 0; i < m.n_layers; ++i) {
    dense_params_ += 2 * d * q + 2 * d * kv + 2 * d;  // q, o; k, v; two norms
    qkv_forward_flops_ += 2 * d * (q + 2 * kv);
    // The attention core's real work: 4 GEMM FLOPs per visible pair and
    // head dimension forward, 8 backward. (nn/flops.h, the MFU numerator,
    // counts twice that, as PaLM does; the efficiency is of the real work.)
    attention_flops_ += 12 * q * nn::layer_attended_pairs(m, i, w_.seq_len) / S;
    // Saved per token (bf16): the norms' outputs, q k v, the attention output
    // and its projection, the residuals; then the FFN's input, gate, up and
    // their product (top_k copies of the expert ones).
    activations += kBf16 * (6 * d + 2 * kv);
    // Elements each token's memory-bound ops move, forward and backward:
    // two RMSNorms (x in, y out; x, dy in, dx out), two residual adds, RoPE
    // on q and k; the SwiGLU gate (gate, up in, h out; back: gate, up, dh
    // in, dgate, dup out) over the FFN's (top_k experts') width.
    elementwise_bytes_ += kBf16 * (16 * d + 4 * (q + kv));
    if (nn::layer_is_moe(e, i)) {
      ++moe_layers_;
      elementwise_bytes_ += kBf16 * 8 * k * eh + kF32 * 4 * static_cast<double>(e.num_experts);
      dense_params_ += d * static_cast<double>(e.num_experts) +
                       static_cast<double>(e.shared_experts) * 3 * d * sh;
      expert_params_ += static_cast<double>(e.num_experts) * 3 * d * eh;
      expert_flops_ += 6 * k * 3 * d * eh;
      activations += kBf16 * k * (d + 3 * eh);
    } else {
      elementwise_bytes_ += kBf16 * 8 * static_cast<double>(m.ffn_hidden);
      dense_params_ += 3 * d * static_cast<double>(m.ffn_hidden);
      activations += kBf16 * (d + 3 * static_cast<double>(m.ffn_hidden));
    }
  }
  activation_bytes_ = activations / static_cast<double>(m.n_layers);
  flops_per_token_ = nn::model_flops_per_token(m, e, w_.seq_len);
  // fp32 logits of a chunk: written, read for the softmax, gradient written.
  loss_bytes_ = kF32 * 3 * static_cast<double>(m.vocab_size);
  dense_flops_ = std::max(0.0, flops_per_token_ - 2 * attention_flops_ - expert_flops_);
}

std::string CostModel::misfit(const LayoutChoice& l) const {
  const nn::ModelConfig& m = w_.model;
  if (l.dp < 1 || l.tp < 1 || l.pp < 1 || l.ep < 1 || l.cp < 1 || l.vpp < 1 || l.micro_batch < 1)
    return "every degree must be >= 1";
  if (!l.tp_2d && m.n_heads % l.tp != 0) return "tp must divide the heads";
  if (w_.moe.num_experts > 0 && w_.moe.num_experts % l.ep != 0) return "ep must divide the experts";
  if (w_.moe.num_experts == 0 && l.ep > 1) return "ep needs experts";
  if ((l.dp * l.cp * l.tp) % l.ep != 0) return "ep must divide the stage's dp x cp x tp ranks";
  if (m.n_layers % (l.pp * l.vpp) != 0) return "pp x vpp must divide the layers";
  if (l.vpp > 1 && l.pp == 1) return "vpp needs pp > 1";
  if (w_.seq_len % (2 * l.cp) != 0 && l.cp > 1)
    return "cp: the sequence must split into 2 cp chunks";
  if (w_.global_batch % (l.dp * l.micro_batch) != 0)
    return "dp x micro_batch must divide the global batch";
  const int64_t microbatches = w_.global_batch / (l.dp * l.micro_batch);
  if (l.vpp > 1 && microbatches % l.pp != 0) return "interleaving needs micro-batches % pp == 0";
  if (l.pp > 1 && microbatches < l.pp) return "1F1B needs at least pp micro-batches per step";
  if (l.recompute != "none" && l.recompute != "selective" && l.recompute != "full")
    return "recompute is none, selective or full";
  if (l.zero3 && !l.zero1) return "zero3 shards what zero1 does too (set both)";
  if (l.tp_2d) {
    const int64_t q = grid_side(l.tp);
    if (q < 2) return "tp2d needs tp = q x q with q >= 2";
    if (m.d_model % q != 0 || m.n_heads % q != 0 || m.n_kv_heads % q != 0)
      return "tp2d: q must divide d_model and the heads";
    if (q > hw_.devices_per_node) return "tp2d: a row of q ranks must fit in a node";
  } else if (l.tp > hw_.devices_per_node) {
    return "1-D tp must fit in a node";
  }
  return "";
}

double CostModel::bubble_ratio(int64_t pp, int64_t microbatches, int64_t vpp) const {
  if (pp == 1) return 0;
  const auto key = std::make_tuple(pp, microbatches, vpp);
  const auto it = bubbles_.find(key);
  if (it != bubbles_.end()) return it->second;
  const double makespan =
      parallel::simulate_schedule(parallel::ScheduleKind::one_f_one_b, pp, microbatches, vpp);
  const double busy = 3.0 * static_cast<double>(microbatches);  // forward 1 + backward 2 each
  return bubbles_[key] = makespan / busy - 1;
}

const Link& CostModel::link(int64_t group, int64_t stride) const {
  // Ranks r, r + stride, ..., r + (group - 1) stride share a node when they
  // fit in one (nodes hold consecutive ranks).
  return (group - 1) * stride + 1 <= hw_.devices_per_node ? hw_.intra : hw_.inter;
}

double CostModel::gemm_rate(double rows, bool grouped) const {
  const double large = grouped ? hw_.grouped_gemm_efficiency : hw_.gemm_efficiency;
  return hw_.peak_flops * large * rows / (rows + hw_.gemm_half_rows);
}

double CostModel::compute_seconds(const LayoutChoice& l) const {
  const double tokens = static_cast<double>(w_.global_batch * w_.seq_len);
  const double world = static_cast<double>(l.world());
  // Recompute runs a layer's forward again (a third of its training FLOPs):
  // all of it under full; under selective the attention's q, k, v
  // projections (nn/recompute.h).
  const double full = l.recompute == "full" ? 4.0 / 3 : 1.0;
  const double attn = l.recompute == "full" ? 4.0 / 3 : 1.0;
  const double projections = l.recompute == "selective" ? qkv_forward_flops_ : 0;
  const double skew = l.ep > 1 ? 1 + w_.routing_skew : 1.0;
  // GEMM rows: a micro-batch's tokens on this rank for the dense ones; for
  // an expert, the tokens the ep group routes to it.
  // (2-D tp splits the rows too: a GEMM of tokens / q rows a device.)
  const double rows = static_cast<double>(l.micro_batch * w_.seq_len / l.cp) /
                      static_cast<double>(l.tp_2d ? grid_side(l.tp) : 1);
  const double expert_rows = w_.moe.num_experts > 0
                                 ? rows / static_cast<double>(l.tp) * static_cast<double>(l.ep) *
                                       static_cast<double>(w_.moe.top_k) /
                                       static_cast<double>(w_.moe.num_experts)
                                 : rows;
  const double gemm = (dense_flops_ * full + projections) / gemm_rate(rows) +
                      expert_flops_ * full * skew / gemm_rate(expert_rows, /*grouped=*/true);
  const double core = attention_flops_ * attn / (hw_.peak_flops * hw_.attention_efficiency);
  return tokens * (gemm + core) / world;
}

void CostModel::add_communication(const LayoutChoice& l, StepCost& c) const {
  const nn::ModelConfig& m = w_.model;
  const double d = static_cast<double>(m.d_model);
  const double mb_tokens = static_cast<double>(l.micro_batch * w_.seq_len / l.cp);
  const double microbatches = static_cast<double>(w_.global_batch / (l.dp * l.micro_batch));
  const double layers = static_cast<double>(m.n_layers / l.pp);
  const double passes = l.recompute == "full" ? 6 : 4;  // collectives per layer: fwd 2, bwd 2 (+2)
  // tp: the activations of a micro-batch, in all-reduces (or all-gather +
  // reduce-scatter pairs under sp: the same bytes): attention and a dense
  // FFN one forward and one backward each (a third under full recompute);
  // a MoE layer, folded into token shards, half of one each way without sp
  // (its slices all-gathered) and nothing with; embedding and head one each
  // per micro-batch.
  const double act = mb_tokens * d * kBf16;
  if (l.tp_2d) {
    add_tp_2d_communication(l, c);
  } else if (l.tp > 1) {
    const Link& tp_link = link(l.tp, 1);
    const double per_module = passes / 2;
    const double dense_layers =
        layers - static_cast<double>(moe_layers_) / static_cast<double>(l.pp);
    const double moe_share = l.sequence_parallel ? 0.0 : per_module / 2;
    const double reductions =
        layers * per_module + dense_layers * per_module + (layers - dense_layers) * moe_share + 2;
    c.tp_comm_s = microbatches * reductions * allreduce_seconds(act, l.tp, tp_link);
    c.tp_bytes = microbatches * reductions * wire_allreduce(act, l.tp);
  }
  // ep: the routed tokens (top_k copies) of this rank's token shard, per MoE layer.
  const double routed =
      mb_tokens / static_cast<double>(l.tp) * static_cast<double>(w_.moe.top_k) * d * kBf16;
  const double moe_layers = static_cast<double>(moe_layers_) / static_cast<double>(l.pp);
  c.ep_comm_s = microbatches * moe_layers * passes * alltoall_s(routed, l.ep, link(l.ep, 1));
  c.ep_bytes = microbatches * moe_layers * passes * routed * static_cast<double>(l.ep - 1) /
               static_cast<double>(l.ep);
  // cp: K and V of this rank's chunk around the ring (forward), and K, V and
  // their gradients (backward), hidden under the attention they overlap.
  if (l.cp > 1) {
    const double kv = mb_tokens * 2 * static_cast<double>(m.n_kv_heads * m.resolved_head_dim()) *
                      kBf16 / static_cast<double>(std::min(l.tp, m.n_kv_heads));
    const Link& cp_link = link(l.cp, l.tp);
    const double steps = 3 * static_cast<double>(l.cp - 1);
    const double ring = microbatches * layers * steps * (cp_link.latency + kv / cp_link.bandwidth);
    const double attention = static_cast<double>(w_.global_batch * w_.seq_len) * attention_flops_ /
                             static_cast<double>(l.world()) /
                             (hw_.peak_flops * hw_.attention_efficiency);
    c.cp_comm_s = std::max(0.0, ring - attention);
    c.cp_bytes = microbatches * layers * steps * kv;
  }
  // pp: a micro-batch's activations across each stage boundary, both ways.
  if (l.pp > 1) {
    const double boundary = act / (l.sequence_parallel ? static_cast<double>(l.tp) : 1.0);
    const Link& pp_link = link(2, l.tp * l.cp * l.dp);
    const double sends = 2 * microbatches * static_cast<double>(l.vpp);
    c.pp_comm_s = sends * (pp_link.latency + boundary / pp_link.bandwidth);
    c.pp_bytes = sends * boundary;
  }
  add_dp_communication(l, c);
}

void CostModel::add_tp_2d_communication(const LayoutChoice& l, StepCost& c) const {
  // What parallel.tp_2d runs (nn/tensor_parallel_2d.h) on a q x q grid: the
  // rows are sequence-parallel 1-D tp over q ranks on 1/q of the
  // micro-batch's rows; the columns all-gather each tp block of a matrix
  // before its forward and again before its backward, and reduce-scatter its
  // gradient (bf16 values, fp32 gradients). bench/dist/bench_tp_2d.cpp checks
  // these bytes against the communicators' counters.
  const nn::ModelConfig& m = w_.model;
  const int64_t side = grid_side(l.tp);
  const double q = static_cast<double>(side), f = (q - 1) / q;
  const double tokens = static_cast<double>(l.micro_batch * w_.seq_len / l.cp) / q;
  const double microbatches = static_cast<double>(w_.global_batch / (l.dp * l.micro_batch));
  const double d = static_cast<double>(m.d_model), hd = static_cast<double>(m.resolved_head_dim());
  const double qd = static_cast<double>(m.n_heads) * hd,
               kv = static_cast<double>(m.n_kv_heads) * hd;
  const double ffn = static_cast<double>(m.ffn_hidden), v = static_cast<double>(m.vocab_size);
  const Link& row = link(side, 1);
  const Link& col = link(side, side);
  const bool full = l.recompute == "full";
  // Rows: an all-gather and a reduce-scatter of the row's activations per
  // module forward, the same in backward (and the forward again under full).
  const double act = tokens * d * kBf16;
  double seconds = 0, bytes = 0;
  const auto row_module = [&](double calls) {
    seconds += calls * (row.latency * (q - 1) + f * act / row.bandwidth);
    bytes += calls * f * act;
  };
  // Columns: a weight's row block (its elements / q), gathered `gathers`
  // times and its fp32 gradient reduce-scattered once.
  double weight_bytes = 0;
  const auto column_weight = [&](double elements, double gathers) {
    const double block = elements / q;
    const double moved = f * block * (gathers * kBf16 + kF32);
    seconds += (gathers + 1) * col.latency * (q - 1) + moved / col.bandwidth;
    bytes += moved;
    weight_bytes += moved;
  };
  const double gathers = full ? 3 : 2;
  for (int64_t i = 0; i < m.n_layers / l.pp; ++i) {  // stage 0's layers
    row_module(full ? 6 : 4);
    for (const double w : {qd * d, kv * d, kv * d, d * qd}) column_weight(w, gathers);
    if (nn::layer_is_moe(w_.moe, i)) continue;
    row_module(full ? 6 : 4);
    for (const double w : {2 * ffn * d, d * ffn}) column_weight(w, gathers);
  }
  // The embedding (its output reduce-scattered, its gradient gathered; its
  // value gathered forward, its gradient summed) and the head (input
  // gathered, gradient reduce-scattered; one pass).
  row_module(4);
  column_weight(v * d, 1);
  if (!m.tie_embeddings) column_weight(v * d, 1);
  c.tp_comm_s = microbatches * seconds;
  c.tp_bytes = microbatches * bytes;
  c.tp_weight_bytes = microbatches * weight_bytes;
}

CostModel::LocalParams CostModel::local_params(const LayoutChoice& l) const {
  LocalParams p;
  p.dense = dense_params_ / static_cast<double>(l.tp * l.pp);
  p.experts = expert_params_ / static_cast<double>(l.ep * l.pp);
  p.dense_group = l.dp * l.cp;
  p.expert_group = l.dp * l.cp * l.tp / l.ep;
  if (l.zero1) {
    p.dense_shards = static_cast<double>(p.dense_group);
    p.expert_shards = static_cast<double>(p.expert_group);
  }
  return p;
}

void CostModel::add_dp_communication(const LayoutChoice& l, StepCost& c) const {
  // fp32 gradients; dense over dp x cp, experts over the stage's ranks
  // holding the same experts. ZeRO-1 reduce-scatters them and all-gathers
  // the bf16 weights; what the last micro-batch's backward covers is
  // hidden. ZeRO-3 gathers the weights for every micro-batch's forward and
  // backward and reduce-scatters its gradients, under its compute.
  const LocalParams p = local_params(l);
  const double microbatches = static_cast<double>(w_.global_batch / (l.dp * l.micro_batch));
  auto reduce = [&](double params, int64_t n, const Link& ln) {
    const double grads = params * kF32;
    const double buckets = std::ceil(grads / kBucketBytes);
    const double lat = buckets * 2 * static_cast<double>(std::max<int64_t>(n - 1, 0)) * ln.latency;
    if (l.zero3)
      return 2 * allgather_seconds(params * kBf16, n, ln) + allgather_seconds(grads, n, ln) + lat;
    if (!l.zero1) return allreduce_seconds(grads, n, ln) + lat;
    return allgather_seconds(grads, n, ln) + allgather_seconds(params * kBf16, n, ln) + lat;
  };
  const double dp_time = reduce(p.dense, p.dense_group, link(p.dense_group, l.tp)) +
                         reduce(p.experts, p.expert_group, link(p.expert_group, l.ep));
  const double wire = wire_allreduce(p.dense * kF32, p.dense_group) +
                      wire_allreduce(p.experts * kF32, p.expert_group);
  if (l.zero3) {
    c.dp_reduce_s = microbatches * dp_time;
    const double hidden = w_.dp_overlap ? c.compute_s / microbatches : 0.0;
    c.dp_comm_s = microbatches * std::max(0.0, dp_time - hidden);
    c.dp_bytes = microbatches * wire;  // 2 bf16 gathers + an fp32 reduce-scatter: one all-reduce
    return;
  }
  const double last_backward = w_.dp_overlap ? c.compute_s * 2.0 / 3 / microbatches : 0.0;
  c.dp_reduce_s = dp_time;
  c.dp_comm_s = std::max(0.0, dp_time - last_backward);
  c.dp_bytes = (l.zero1 ? 0.75 : 1.0) * wire;
}

double CostModel::memory_per_device(const LayoutChoice& l) const {
  const LocalParams p = local_params(l);
  // bf16 weights (sharded under ZeRO-3, plus two layers gathered: the one
  // running and the next one prefetched); gradients fp32 (bf16 when they go
  // to the host); fp32 master and two moments sharded under ZeRO-1, on the
  // host when offloaded.
  const double stage_layers = static_cast<double>(w_.model.n_layers) / static_cast<double>(l.pp);
  const double weights = l.zero3 ? p.sharded() + 2 * p.whole() / stage_layers : p.whole();
  const double grad_bytes = l.offload ? kBf16 : kF32;
  const double state = weights * kBf16 + grad_bytes * (l.zero3 ? p.sharded() : p.whole()) +
                       (l.offload ? 0.0 : 3 * kF32 * p.sharded());
  // Activations of the first stage: 1F1B keeps pp micro-batches in flight
  // (interleaving adds (pp - 1) / vpp chunks' worth).
  const double microbatches = static_cast<double>(w_.global_batch / (l.dp * l.micro_batch));
  const double pp = static_cast<double>(l.pp), vpp = static_cast<double>(l.vpp);
  const double in_flight = std::min(microbatches, pp * (1 + (pp - 1) / (pp * vpp)));
  const double tokens = static_cast<double>(l.micro_batch * w_.seq_len / l.cp);
  const double layers = static_cast<double>(w_.model.n_layers) / pp;
  const double per_token_layer = activation_bytes_ / static_cast<double>(l.tp);
  const double stored =
      l.recompute == "full"
          ? layers * kBf16 * static_cast<double>(w_.model.d_model) / static_cast<double>(l.tp) +
                per_token_layer
          : layers * per_token_layer;
  return state + in_flight * tokens * stored;
}

StepCost CostModel::predict(const LayoutChoice& l) const {
  const std::string why = misfit(l);
  MOETRON_CHECK(why.empty(), "layout ", l.str(), ": ", why);
  return estimate(l);
}

StepCost CostModel::estimate(const LayoutChoice& l) const {
  StepCost c;
  c.compute_s = compute_seconds(l);
  add_communication(l, c);
  const double local = local_params(l).sharded();
  if (l.offload) {
    // On the host's cores and memory, the fp32 gradients down and the bf16
    // weights back up over PCIe; masters, moments and gradients live there.
    c.optimizer_s = local * kOptimizerBytesPerParam / hw_.host_memory_bandwidth +
                    local * (kF32 + kBf16) / hw_.pcie_bandwidth;
    c.host_bytes = local * (3 * kF32 + kF32);
  } else {
    c.optimizer_s = local * kOptimizerBytesPerParam / hw_.memory_bandwidth;
  }
  // Layers split over tp and pp, tokens over dp and cp; the loss on the last stage.
  const double tokens_here =
      static_cast<double>(w_.global_batch * w_.seq_len) / static_cast<double>(l.dp * l.cp);
  // The forward's half again under full; under selective most of it (norms,
  // RoPE, SwiGLU, the permutation; not the residual adds).
  const double recompute = l.recompute == "full" ? 1.5 : l.recompute == "selective" ? 1.4 : 1.0;
  c.elementwise_s = tokens_here *
                    (elementwise_bytes_ * recompute / static_cast<double>(l.pp) + loss_bytes_) /
                    static_cast<double>(l.tp) / hw_.elementwise_bandwidth;
  // The pipeline idles everything its forwards and backwards run: their
  // compute, elementwise work and exposed tp, ep, cp and pp communication.
  const double microbatches = static_cast<double>(w_.global_batch / (l.dp * l.micro_batch));
  c.bubble_s = pipelined_seconds(c) * bubble_ratio(l.pp, static_cast<int64_t>(microbatches), l.vpp);
  c.step_s = c.compute_s + c.elementwise_s + c.bubble_s + c.pp_comm_s + c.tp_comm_s + c.ep_comm_s +
             c.cp_comm_s + c.dp_comm_s + c.optimizer_s;
  const double tokens = static_cast<double>(w_.global_batch * w_.seq_len);
  c.tokens_per_s = tokens / c.step_s;
  c.tflops_per_device = flops_per_token_ * c.tokens_per_s / static_cast<double>(l.world()) / 1e12;
  c.mfu = c.tflops_per_device * 1e12 / hw_.peak_flops;
  c.memory_bytes = memory_per_device(l);
  return c;
}

std::vector<std::string> layout_items(const std::string& text) {
  std::vector<std::string> items;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    if (comma > pos) items.push_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return items;
}

LayoutChoice parse_layout(const std::string& text, int64_t devices) {
  LayoutChoice l;
  bool dp_given = false;
  for (const std::string& item : layout_items(text)) {
    if (item == "tp2d") {
      l.tp_2d = true;
      continue;
    }
    if (item == "zero1" || item == "zero3" || item == "offload") {
      l.zero1 = l.zero1 || item != "offload";
      l.zero3 = l.zero3 || item == "zero3";
      l.offload = l.offload || item == "offload";
      continue;
    }
    const size_t eq = item.find('=');
    MOETRON_CHECK(eq != std::string::npos, "--layout: '", item, "' is not key=value");
    const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    if (k == "recompute") {
      l.recompute = v;
      continue;
    }
    int64_t n = 0;
    try {
      n = std::stoll(v);
    } catch (const std::exception&) {
      MOETRON_FAIL("--layout: '", item, "': the value is not a number");
    }
    int64_t* field = k == "dp"    ? &l.dp
                     : k == "tp"  ? &l.tp
                     : k == "pp"  ? &l.pp
                     : k == "ep"  ? &l.ep
                     : k == "cp"  ? &l.cp
                     : k == "vpp" ? &l.vpp
                     : k == "mb"  ? &l.micro_batch
                                  : nullptr;
    MOETRON_CHECK(field, "--layout: unknown key '", k,
                  "' (dp, tp, pp, ep, cp, vpp, mb, recompute, zero1, zero3, offload, tp2d)");
    *field = n;
    dp_given = dp_given || k == "dp";
  }
  const int64_t others = l.tp * l.pp * l.cp;
  if (!dp_given) l.dp = others > 0 && devices % others == 0 ? devices / others : 0;
  MOETRON_CHECK(l.world() == devices, "--layout ", text, ": dp x tp x pp x cp = ", l.world(),
                ", the cluster has ", devices, " devices");
  return l;
}

double memory_budget(const HardwareProfile& hw) {
  return kMemoryHeadroom * hw.memory_bytes;
}

bool fits_memory(const StepCost& c, const HardwareProfile& hw) {
  return c.memory_bytes <= memory_budget(hw) &&
         c.host_bytes <= kMemoryHeadroom * hw.host_memory_bytes;
}

}  // namespace moetron::planner
