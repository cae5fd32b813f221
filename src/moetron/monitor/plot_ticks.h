// Axis ticks for the report's plots: round numbers (1, 2 or 5 times a power
// of ten) covering a data range, decades for log axes, and their labels.
#pragma once

#include <string>
#include <vector>

namespace moetron::monitor {

// A "nice" tick spacing: 1, 2 or 5 x 10^k, about range / target.
double nice_step(double range, int target);

// Ticks k * step covering [lo, hi] (the first <= lo, the last >= hi), about
// `target` of them. With `integer` the spacing is at least 1 (step numbers).
// lo == hi is widened first, so the result always has at least two ticks.
std::vector<double> nice_ticks(double lo, double hi, int target, bool integer = false);

// Ticks for a log axis over [lo, hi] (both > 0): powers of ten, with 2 and 5
// between them when the range spans few decades; within one decade, round
// linear ticks. The first tick is <= lo and the last >= hi.
std::vector<double> log_ticks(double lo, double hi);

// Labels for a set of ticks, with one format for the whole axis: fixed
// decimals just enough for the spacing, k/M/G/T suffixes from 10^4 up, and
// a power of ten below 10^-3 ("2e-5").
std::vector<std::string> tick_labels(const std::vector<double>& ticks);

// One number for a table: up to `digits` significant digits, k/M/G suffixes
// from 10^4, "-" for NaN.
std::string format_number(double v, int digits = 4);

}  // namespace moetron::monitor
