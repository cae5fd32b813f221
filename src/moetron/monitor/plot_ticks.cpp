#include "moetron/monitor/plot_ticks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace moetron::monitor {

namespace {

constexpr int kMaxTicks = 1000;  // a guard against a spacing lost to rounding

// "1.5e-05" -> "1.5e-5", "2e+06" -> "2e6".
std::string clean_exponent(std::string s) {
  const size_t e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mant = s.substr(0, e), exp = s.substr(e + 1);
  const bool neg = !exp.empty() && exp[0] == '-';
  if (!exp.empty() && (exp[0] == '-' || exp[0] == '+')) exp = exp.substr(1);
  while (exp.size() > 1 && exp[0] == '0') exp = exp.substr(1);
  return mant + "e" + (neg ? "-" : "") + exp;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  std::string s = buf;
  if (s.find_first_not_of("-0.") == std::string::npos) return "0";  // "-0.00"
  return s;
}

std::string general(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
  return clean_exponent(buf);
}

// k, M, G, T for 10^3 .. 10^12.
const char* si_suffix(int e3) {
  switch (e3) {
    case 3:
      return "k";
    case 6:
      return "M";
    case 9:
      return "G";
    default:
      return "T";
  }
}

bool uniformly_spaced(const std::vector<double>& t) {
  for (size_t i = 2; i < t.size(); ++i) {
    const double a = t[1] - t[0], b = t[i] - t[i - 1];
    if (std::fabs(a - b) > 1e-6 * std::fabs(a)) return false;
  }
  return true;
}

}  // namespace

double nice_step(double range, int target) {
  if (!(range > 0) || !std::isfinite(range)) return 1.0;
  const double raw = range / std::max(target, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  const double nf = f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10;
  return nf * mag;
}

std::vector<double> nice_ticks(double lo, double hi, int target, bool integer) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  if (hi - lo <= std::fabs(hi) * 1e-12 || hi == lo) {
    const double pad = integer ? 1.0 : (lo != 0 ? std::fabs(lo) * 0.1 : 1.0);
    lo -= pad;
    hi += pad;
  }
  double step = nice_step(hi - lo, target);
  if (integer) step = std::max(step, 1.0);
  const double k0 = std::floor(lo / step + 1e-9), k1 = std::ceil(hi / step - 1e-9);
  std::vector<double> t;
  for (double k = k0; k <= k1 && t.size() < kMaxTicks; k += 1) {
    const double v = k * step;
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  }
  if (t.size() < 2) t.push_back(t.back() + step);
  return t;
}

std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;
  if (!(lo > 0) || !(hi >= lo)) return t;
  const double span = std::log10(hi / lo);
  if (span < 1) {
    for (double v : nice_ticks(lo, hi, 5))
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9) && v > 0) t.push_back(v);
    return t;
  }
  const int e0 = static_cast<int>(std::floor(std::log10(lo))),
            e1 = static_cast<int>(std::ceil(std::log10(hi)));
  const int every = std::max(1, static_cast<int>(std::ceil(span / 8)));
  for (int e = e0; e <= e1; ++e) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m != 1.0 && span > 3) continue;
      if (m == 1.0 && (e - e0) % every != 0) continue;
      const double v = m * std::pow(10.0, e);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
    }
  }
  return t;
}

std::vector<std::string> tick_labels(const std::vector<double>& ticks) {
  std::vector<std::string> out;
  if (ticks.empty()) return out;
  double m = 0;
  for (double v : ticks) m = std::max(m, std::fabs(v));
  if (ticks.size() < 2 || !uniformly_spaced(ticks)) {
    for (double v : ticks) out.push_back(format_number(v, 3));
    return out;
  }
  const double d = std::fabs(ticks[1] - ticks[0]);
  const int kd = static_cast<int>(std::floor(std::log10(d) + 1e-9));
  for (double v : ticks) {
    if (v == 0) {
      out.push_back("0");
    } else if (m >= 1e4) {
      const int e3 = std::min(12, static_cast<int>(std::floor(std::log10(m) / 3)) * 3);
      out.push_back(fixed(v / std::pow(10.0, e3), std::max(0, e3 - kd)) + si_suffix(e3));
    } else if (m < 1e-3) {
      out.push_back(general(v, 3));
    } else {
      out.push_back(fixed(v, std::max(0, -kd)));
    }
  }
  return out;
}

std::string format_number(double v, int digits) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  const double a = std::fabs(v);
  if (a >= 1e4 && a < 1e15) {
    const int e3 = std::min(12, static_cast<int>(std::floor(std::log10(a) / 3)) * 3);
    return general(v / std::pow(10.0, e3), digits) + si_suffix(e3);
  }
  return general(v, digits);
}

}  // namespace moetron::monitor
