#include "moetron/parallel/bucket_plan.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::parallel {

namespace {

void pad_to(BucketSpec& b, int dp) { b.numel = (b.numel + dp - 1) / dp * dp; }

}  // namespace

std::vector<BucketSpec> flat_bucket_plan(const nn::ParameterSet& params, int dp, int64_t bucket_bytes,
                                         const std::function<bool(const nn::Parameter&)>& include) {
  MOETRON_CHECK(bucket_bytes > 0, "gradient bucket size must be positive, got ", bucket_bytes);
  std::vector<BucketSpec> out;
  BucketSpec cur;
  const auto& all = params.all();
  for (size_t i = all.size(); i-- > 0;) {
    nn::Parameter* p = all[i].get();
    if (include && !include(*p)) continue;
    cur.slots.push_back({p, cur.numel, p->grad.numel(), -1});
    cur.numel += p->grad.numel();
    if (cur.numel * 4 >= bucket_bytes) {
      pad_to(cur, dp);
      out.push_back(std::move(cur));
      cur = BucketSpec{};
    }
  }
  if (!cur.slots.empty()) {
    pad_to(cur, dp);
    out.push_back(std::move(cur));
  }
  return out;
}

double newton_schulz_cost(int64_t m, int64_t n) {
  const auto s = static_cast<double>(std::min(m, n)), l = static_cast<double>(std::max(m, n));
  return 2.0 * s * s * l + s * s * s;
}

std::vector<BucketSpec> owner_bucket_plan(const nn::ParameterSet& params, int dp, int64_t bucket_bytes,
                                          const std::function<bool(const nn::Parameter&)>& owned,
                                          const std::function<bool(const nn::Parameter&)>& include) {
  MOETRON_CHECK(bucket_bytes > 0, "gradient bucket size must be positive, got ", bucket_bytes);
  std::vector<BucketSpec> out;
  std::vector<double> load(static_cast<size_t>(dp), 0.0);  // Newton-Schulz cost per rank, all buckets
  // Owned matrices gather in `group` until it holds bucket_bytes; the rest in `flat`.
  std::vector<nn::Parameter*> group;
  int64_t group_numel = 0;
  BucketSpec flat;
  auto close_group = [&] {
    if (group.empty()) return;
    std::vector<nn::Parameter*> order = group;
    std::stable_sort(order.begin(), order.end(), [](const nn::Parameter* a, const nn::Parameter* b) {
      return newton_schulz_cost(a->value.dim(0), a->value.dim(1)) > newton_schulz_cost(b->value.dim(0), b->value.dim(1));
    });
    std::vector<std::vector<nn::Parameter*>> per_rank(static_cast<size_t>(dp));
    for (nn::Parameter* p : order) {
      const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      load[r] += newton_schulz_cost(p->value.dim(0), p->value.dim(1));
      per_rank[r].push_back(p);
    }
    int64_t chunk = 1;
    for (const auto& ps : per_rank) {
      int64_t n = 0;
      for (const nn::Parameter* p : ps) n += p->grad.numel();
      chunk = std::max(chunk, n);
    }
    BucketSpec b;
    for (size_t r = 0; r < per_rank.size(); ++r) {
      int64_t off = static_cast<int64_t>(r) * chunk;
      for (nn::Parameter* p : per_rank[r]) {
        b.slots.push_back({p, off, p->grad.numel(), static_cast<int>(r)});
        off += p->grad.numel();
      }
    }
    b.numel = chunk * dp;
    out.push_back(std::move(b));
    group.clear();
    group_numel = 0;
  };
  auto close_flat = [&] {
    if (flat.slots.empty()) return;
    pad_to(flat, dp);
    out.push_back(std::move(flat));
    flat = BucketSpec{};
  };
  const auto& all = params.all();
  for (size_t i = all.size(); i-- > 0;) {
    nn::Parameter* p = all[i].get();
    if (include && !include(*p)) continue;
    if (owned(*p)) {
      MOETRON_CHECK(p->value.rank() == 2, "owner-based buckets hold matrices; '", p->name, "' is ",
                    p->value.shape().str());
      group.push_back(p);
      group_numel += p->grad.numel();
      if (group_numel * 4 >= bucket_bytes) close_group();
    } else {
      flat.slots.push_back({p, flat.numel, p->grad.numel(), -1});
      flat.numel += p->grad.numel();
      if (flat.numel * 4 >= bucket_bytes) close_flat();
    }
  }
  close_group();
  close_flat();
  return out;
}

int64_t max_chunk_share(const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t chunk, int64_t n) {
  int64_t most = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t lo = r * chunk, hi = lo + chunk;
    int64_t held = 0;
    for (const auto& [offset, numel] : ranges) held += std::max<int64_t>(0, std::min(hi, offset + numel) - std::max(lo, offset));
    most = std::max(most, held);
  }
  return most;
}

}  // namespace moetron::parallel
