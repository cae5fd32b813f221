#include "moetron/monitor/prometheus_text.h"

#include <charconv>
#include <cmath>
#include <sstream>

#include "moetron/core/error.h"

namespace moetron::monitor {

std::string format_sample_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

namespace {

std::string escape_help(const std::string& h) {
  std::string out;
  for (char c : h) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string help_line(const MetricDef& d) {
  std::string h = d.help;
  if (!d.unit.empty()) h += " (" + d.unit + ")";
  return escape_help(h);
}

void write_histogram(std::ostringstream& os, const MetricDef& d, const SeriesValue& s) {
  std::vector<std::string> names = d.labels;
  names.push_back("le");
  for (size_t i = 0; i <= d.buckets.size(); ++i) {
    LabelValues lv = s.labels;
    lv.push_back(i < d.buckets.size() ? format_sample_value(d.buckets[i]) : "+Inf");
    os << series_key(d.name + "_bucket", names, lv) << " " << s.bucket_counts[i] << "\n";
  }
  os << series_key(d.name + "_sum", d.labels, s.labels) << " " << format_sample_value(s.sum)
     << "\n";
  os << series_key(d.name + "_count", d.labels, s.labels) << " " << s.count << "\n";
}

}  // namespace

std::string prometheus_text(const Snapshot& snapshot) {
  std::ostringstream os;
  for (const MetricSnapshot& m : snapshot) {
    const MetricDef& d = m.def;
    if (m.series.empty()) continue;  // a family with no samples says nothing
    os << "# HELP " << d.name << " " << help_line(d) << "\n";
    os << "# TYPE " << d.name << " " << name_of(d.kind) << "\n";
    for (const SeriesValue& s : m.series) {
      if (d.kind == MetricKind::histogram) {
        write_histogram(os, d, s);
      } else {
        os << series_key(d.name, d.labels, s.labels) << " " << format_sample_value(s.value) << "\n";
      }
    }
  }
  return os.str();
}

std::string ParsedSample::key() const {
  std::vector<std::string> names;
  LabelValues values;
  for (const auto& [n, v] : labels) {
    names.push_back(n);
    values.push_back(v);
  }
  return series_key(name, names, values);
}

double ParsedExposition::value(const std::string& key) const {
  for (const ParsedSample& s : samples) {
    if (s.key() == key) return s.value;
  }
  MOETRON_FAIL("no series '", key, "' in the exposition");
}

namespace {

struct LineParser {
  const std::string& line;
  int number;
  size_t pos = 0;

  [[noreturn]] void fail(const std::string& what) const {
    MOETRON_FAIL("exposition line ", number, ": ", what, ": '", line, "'");
  }
  std::string name(bool colon_ok) {
    const size_t start = pos;
    while (pos < line.size() && (std::isalnum(static_cast<unsigned char>(line[pos])) ||
                                 line[pos] == '_' || (colon_ok && line[pos] == ':'))) {
      ++pos;
    }
    if (pos == start) fail("expected a name");
    return line.substr(start, pos - start);
  }
  std::string quoted() {
    if (pos >= line.size() || line[pos] != '"') fail("expected '\"'");
    std::string out;
    for (++pos; pos < line.size() && line[pos] != '"'; ++pos) {
      if (line[pos] == '\\') {
        if (++pos >= line.size()) fail("dangling escape");
        const char c = line[pos];
        if (c == 'n') {
          out += '\n';
        } else if (c == '\\' || c == '"') {
          out += c;
        } else {
          fail("unknown escape");
        }
      } else {
        out += line[pos];
      }
    }
    if (pos >= line.size()) fail("unterminated label value");
    ++pos;
    return out;
  }
  void expect(char c) {
    if (pos >= line.size() || line[pos] != c) fail(std::string("expected '") + c + "'");
    ++pos;
  }
  double number_value() {
    while (pos < line.size() && line[pos] == ' ') ++pos;
    const size_t end = line.find(' ', pos);
    const std::string tok = line.substr(pos, end == std::string::npos ? end : end - pos);
    pos = end == std::string::npos ? line.size() : end;
    if (tok == "NaN") return NAN;
    if (tok == "+Inf") return INFINITY;
    if (tok == "-Inf") return -INFINITY;
    double v = 0;
    const auto r = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (r.ec != std::errc() || r.ptr != tok.data() + tok.size()) fail("bad value '" + tok + "'");
    return v;
  }
  ParsedSample sample() {
    ParsedSample s;
    s.name = name(true);
    if (pos < line.size() && line[pos] == '{') {
      ++pos;
      while (pos < line.size() && line[pos] != '}') {
        std::string label = name(false);
        expect('=');
        s.labels.emplace_back(std::move(label), quoted());
        if (pos < line.size() && line[pos] == ',') ++pos;
      }
      expect('}');
    }
    if (pos >= line.size() || line[pos] != ' ') fail("expected a space before the value");
    s.value = number_value();
    return s;
  }
};

void parse_comment(const std::string& line, ParsedExposition& out) {
  std::istringstream is(line);
  std::string hash, word, family;
  is >> hash >> word >> family;
  if (word != "HELP" && word != "TYPE") return;  // other comments are free text
  std::string rest;
  std::getline(is, rest);
  if (!rest.empty() && rest[0] == ' ') rest.erase(0, 1);
  (word == "HELP" ? out.help : out.type)[family] = rest;
}

}  // namespace

ParsedExposition parse_prometheus_text(const std::string& text) {
  ParsedExposition out;
  std::istringstream is(text);
  std::string line;
  int number = 0;
  while (std::getline(is, line)) {
    ++number;
    if (line.empty()) continue;
    if (line[0] == '#') {
      parse_comment(line, out);
      continue;
    }
    LineParser p{line, number};
    out.samples.push_back(p.sample());
  }
  return out;
}

}  // namespace moetron::monitor
