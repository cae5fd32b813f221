// matmul family benchmarks: the GEMMs of bench-moe (forward, dX = dY W,
// dW = dY^T X) in fp32 and bf16, and the grouped expert GEMMs. Each wrapper
// call is timed next to the bare oneDNN primitive on the same buffers,
// created once outside the timed loop and executed directly; ratio =
// wrapper / raw throughput (target >= 0.90). The grouped forward and dX also
// report raw_rt_gflops: one run-time-M primitive for every expert, the
// alternative to caching a primitive per distinct M.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench_util.h"
#include "moetron/core/rng.h"
#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/kernels/cpu/cpu_state.h"
#include "moetron/kernels/matmul.h"

namespace moetron::bench {
namespace {

using dnnl::memory;
using kernels::Backend;
using kernels::Context;
using kernels::MatmulArgs;
using kernels::cpu::CpuState;

Tensor random(const Shape& shape, DType dt, const char* name) {
  Tensor t = Tensor::empty(shape, dt, MemTag::workspace);
  fill_uniform(t, 7, name, -1.0f, 1.0f);
  return t;
}

memory::data_type dnnl_type(DType t) {
  return t == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// The GEMM c[m, n] = op(a) op(b), a stored [m, k] (or [k, m] if ta), b
// stored [k, n] (or [n, k] if tb), written straight against the oneDNN API.
struct RawShape {
  int64_t m, n, k;
  bool ta, tb;
  DType ab, c;
};
enum class Rt { none, m, k };

struct RawDescs {
  memory::desc a, b, c;
};
RawDescs raw_descs(const RawShape& s, Rt rt) {
  constexpr int64_t R = DNNL_RUNTIME_DIM_VAL;
  const int64_t m = rt == Rt::m ? R : s.m, k = rt == Rt::k ? R : s.k, n = s.n;
  return {memory::desc({m, k}, dnnl_type(s.ab), s.ta ? memory::dims{1, m} : memory::dims{k, 1}),
          memory::desc({k, n}, dnnl_type(s.ab), s.tb ? memory::dims{1, k} : memory::dims{n, 1}),
          memory::desc({m, n}, dnnl_type(s.c), memory::dims{n, 1})};
}

dnnl::primitive raw_primitive(CpuState& st, const RawShape& s, Rt rt = Rt::none) {
  const RawDescs d = raw_descs(s, rt);
  return dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(d.a, d.b, d.c), st.engine));
}

struct RawCall {
  dnnl::primitive prim;
  std::unordered_map<int, memory> args;
};
RawCall raw_call(CpuState& st, dnnl::primitive prim, const RawShape& s, const void* a,
                 const void* b, void* c) {
  const RawDescs d = raw_descs(s, Rt::none);
  return {std::move(prim),
          {{DNNL_ARG_SRC, memory(d.a, st.engine, const_cast<void*>(a))},
           {DNNL_ARG_WEIGHTS, memory(d.b, st.engine, const_cast<void*>(b))},
           {DNNL_ARG_DST, memory(d.c, st.engine, c)}}};
}
void run_all(CpuState& st, std::vector<RawCall>& calls) {
  for (auto& call : calls) call.prim.execute(st.stream, call.args);
  st.stream.wait();
}

// Wrapper and raw calls alternate one by one, so that other processes on the
// (shared) machine slow both sides alike. Returns the median seconds of each
// and the median of the per-pair ratios raw/wrapper, which is far steadier
// than a ratio of two medians measured at different times.
struct PairTiming {
  double wrapper, raw, ratio;
};
PairTiming time_pair(Runner& r, const std::function<void()>& wrapper,
                     const std::function<void()>& raw) {
  using clock = std::chrono::steady_clock;
  const double min_seconds = r.quick() ? 0.05 : 0.6;
  auto seconds = [](const std::function<void()>& fn) {
    const auto a = clock::now();
    fn();
    return std::chrono::duration<double>(clock::now() - a).count();
  };
  wrapper();  // warm-up: primitive creation, page faults
  raw();
  std::vector<double> tw, tr, ratio;
  const auto start = clock::now();
  while (tw.size() < 5 ||
         std::chrono::duration<double>(clock::now() - start).count() < min_seconds) {
    // Alternate which side goes first so neither always sees a warmer cache.
    const bool wrapper_first = tw.size() % 2 == 0;
    const double a = seconds(wrapper_first ? wrapper : raw);
    const double b = seconds(wrapper_first ? raw : wrapper);
    tw.push_back(wrapper_first ? a : b);
    tr.push_back(wrapper_first ? b : a);
    ratio.push_back(tr.back() / tw.back());
    if (tw.size() >= 1000) break;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  return {median(tw), median(tr), median(ratio)};
}

void record(Runner& r, const std::string& name, const std::string& shape, DType ab, DType c,
            double flops, const PairTiming& t, double t_rt = 0) {
  Result res;
  res.name = name;
  res.labels = {{"shape", shape},
                {"dtype", std::string(dtype_name(ab))},
                {"out", std::string(dtype_name(c))}};
  res.metrics = {{"seconds", t.wrapper},
                 {"gflops", flops / t.wrapper * 1e-9},
                 {"raw_gflops", flops / t.raw * 1e-9},
                 {"ratio", t.ratio}};
  if (t_rt > 0) res.metrics["raw_rt_gflops"] = flops / t_rt * 1e-9;
  r.record(std::move(res));
}

std::string mnk(int64_t m, int64_t n, int64_t k) {
  return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
}

// A linear layer y = x w^T with x [t, in], w [out, in]: its three GEMMs.
struct Linear {
  const char* name;
  int64_t tokens, out, in;
};

void bench_linear(Runner& r, Context& ctx, const Linear& l, DType dt) {
  CpuState& st = ctx.cpu_state();
  const int64_t t = r.quick() ? l.tokens / 16 : l.tokens;
  // Activations and their gradients in the compute dtype; weight gradients fp32.
  const DType act = dt, grad_w = DType::f32;
  Tensor x = random({t, l.in}, dt, "x"), w = random({l.out, l.in}, dt, "w");
  Tensor dy = random({t, l.out}, dt, "dy");
  Tensor y = Tensor::empty({t, l.out}, act, MemTag::workspace);
  Tensor dx = Tensor::empty({t, l.in}, act, MemTag::workspace);
  Tensor dw = Tensor::empty({l.out, l.in}, grad_w, MemTag::workspace);
  struct Pass {
    const char* pass;
    const Tensor *a, *b, *c;
    MatmulArgs args;
    RawShape raw;
  };
  MatmulArgs fwd, none, ta;
  fwd.trans_b = true;
  ta.trans_a = true;
  const Pass passes[] = {
      {"fwd", &x, &w, &y, fwd, {t, l.out, l.in, false, true, dt, act}},
      {"dx", &dy, &w, &dx, none, {t, l.in, l.out, false, false, dt, act}},
      {"dw", &dy, &x, &dw, ta, {l.out, l.in, t, true, false, dt, grad_w}},
  };
  for (const Pass& p : passes) {
    std::vector<RawCall> raw;
    raw.push_back(
        raw_call(st, raw_primitive(st, p.raw), p.raw, p.a->raw(), p.b->raw(), p.c->raw()));
    const PairTiming tp = time_pair(
        r, [&] { kernels::matmul(ctx, *p.a, *p.b, *p.c, p.args); }, [&] { run_all(st, raw); });
    record(r, std::string("matmul/") + l.name + "/" + p.pass + "/" + std::string(dtype_name(dt)),
           mnk(p.raw.m, p.raw.n, p.raw.k), dt, p.raw.c, 2.0 * p.raw.m * p.raw.n * p.raw.k, tp);
  }
}

// Expert GEMMs over row groups: x [T, in], w [E, out, in].
void bench_grouped(Runner& r, Context& ctx, const char* name, const std::vector<int64_t>& rows,
                   int64_t out, int64_t in, DType dt) {
  CpuState& st = ctx.cpu_state();
  const int64_t groups = static_cast<int64_t>(rows.size());
  std::vector<int64_t> off = {0};
  for (int64_t n : rows) off.push_back(off.back() + (r.quick() ? n / 16 : n));
  const int64_t t = off.back();
  Tensor x = random({t, in}, dt, "x"), w = random({groups, out, in}, dt, "w");
  Tensor dy = random({t, out}, dt, "dy");
  Tensor y = Tensor::empty({t, out}, dt, MemTag::workspace);
  Tensor dx = Tensor::empty({t, in}, dt, MemTag::workspace);
  Tensor dw = Tensor::empty({groups, out, in}, DType::f32, MemTag::workspace);
  auto at = [](const Tensor& a, int64_t elems) {
    return static_cast<char*>(a.raw()) + elems * static_cast<int64_t>(a.element_size());
  };
  const double flops = 2.0 * static_cast<double>(t) * static_cast<double>(out * in);
  const std::string shape = std::to_string(groups) + "x[" + std::to_string(t / groups) + "]x" +
                            std::to_string(out) + "x" + std::to_string(in);
  const std::string prefix = std::string("matmul/grouped_") + name + "/";
  for (int pass = 0; pass < 3; ++pass) {
    // Per expert: fwd y_e = x_e w_e^T; dx_e = dy_e w_e; dw_e = dy_e^T x_e.
    std::vector<RawCall> fixed, runtime;
    std::unordered_map<int64_t, dnnl::primitive> by_rows;
    dnnl::primitive rt_prim;
    for (int64_t e = 0; e < groups; ++e) {
      const int64_t n_rows = off[e + 1] - off[e];
      RawShape s;
      const void *a, *b;
      void* c;
      if (pass == 0) {
        s = {n_rows, out, in, false, true, dt, dt};
        a = at(x, off[e] * in), b = at(w, e * out * in), c = at(y, off[e] * out);
      } else if (pass == 1) {
        s = {n_rows, in, out, false, false, dt, dt};
        a = at(dy, off[e] * out), b = at(w, e * out * in), c = at(dx, off[e] * in);
      } else {
        s = {out, in, n_rows, true, false, dt, DType::f32};
        a = at(dy, off[e] * out), b = at(x, off[e] * in), c = at(dw, e * out * in);
      }
      auto it = by_rows.find(n_rows);
      if (it == by_rows.end()) it = by_rows.emplace(n_rows, raw_primitive(st, s)).first;
      fixed.push_back(raw_call(st, it->second, s, a, b, c));
      if (e == 0) rt_prim = raw_primitive(st, s, pass == 2 ? Rt::k : Rt::m);
      runtime.push_back(raw_call(st, rt_prim, s, a, b, c));
    }
    std::function<void()> wrapper;
    const char* pass_name = pass == 0 ? "fwd" : pass == 1 ? "dx" : "dw";
    if (pass == 0) wrapper = [&] { kernels::grouped_matmul(ctx, x, w, off, y, true, 0.0f); };
    if (pass == 1) wrapper = [&] { kernels::grouped_matmul(ctx, dy, w, off, dx, false, 0.0f); };
    if (pass == 2)
      wrapper = [&] { kernels::grouped_matmul_weight_grad(ctx, dy, x, off, dw, 0.0f); };
    const PairTiming tp = time_pair(r, wrapper, [&] { run_all(st, fixed); });
    const double t_rt = r.time_median([&] { run_all(st, runtime); }, 0.3);
    record(r, prefix + pass_name + "/" + std::string(dtype_name(dt)), shape, dt,
           pass == 2 ? DType::f32 : dt, flops, tp, t_rt);
  }
}

void bench_matmul(Runner& r) {
  Context ctx(Backend::cpu);
  // bench-moe: 4096 tokens, D 512, vocab 8192, 8 experts x 1024 rows, hidden 1024.
  const Linear layers[] = {
      {"qkvo_proj", 4096, 512, 512},
      {"expert_gate_up", 1024, 2048, 512},
      {"expert_down", 1024, 512, 1024},
      {"lm_head", 4096, 8192, 512},
  };
  const std::vector<int64_t> uniform(8, 1024);
  // Top-2 routing is never even: +-40% around the mean, summing to 8192.
  const std::vector<int64_t> skewed = {640, 1408, 896, 1152, 1024, 768, 1280, 1024};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Linear& l : layers) bench_linear(r, ctx, l, dt);
    bench_grouped(r, ctx, "gate_up", uniform, 2048, 512, dt);
    bench_grouped(r, ctx, "down", uniform, 512, 1024, dt);
    bench_grouped(r, ctx, "gate_up_skewed", skewed, 2048, 512, dt);
  }
}

}  // namespace

MOETRON_BENCH("matmul", bench_matmul);

}  // namespace moetron::bench
