#include "moetron/train/launch_output.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "moetron/core/error.h"

namespace moetron::train {

namespace fs = std::filesystem;

namespace {

constexpr size_t kTailLines = 10;

// mpirun --tag-output puts "[J,R]<stdout>:" (or <stderr>) before every chunk
// a rank wrote and after every newline inside one, so a tag can also appear
// in the middle of a line (a rank writes "rank 1: " and "error: ..." in two
// calls; another rank's chunk lands after a line without its newline).
// Parses a tag at `p`: 1 and sets rank / is_stderr / length when there is
// one, 0 when there is none, -1 when `s` ends before that can be decided.
int parse_tag(const std::string& s, size_t p, int& rank, bool& is_stderr, size_t& length) {
  size_t i = p + 1;
  auto digits = [&](size_t& q) {
    const size_t start = q;
    while (q < s.size() && ::isdigit(static_cast<unsigned char>(s[q]))) ++q;
    return q - start;
  };
  if (digits(i) == 0) return i >= s.size() ? -1 : 0;
  if (i >= s.size()) return -1;
  if (s[i++] != ',') return 0;
  const size_t rank_at = i;
  if (digits(i) == 0) return i >= s.size() ? -1 : 0;
  const size_t rank_len = i - rank_at;
  for (const char* tail : {"]<stdout>:", "]<stderr>:"}) {
    const size_t n = std::strlen(tail);
    const size_t have = std::min(n, s.size() - i);
    if (s.compare(i, have, tail, have) != 0) continue;
    if (have < n) return -1;
    rank = std::stoi(s.substr(rank_at, rank_len));
    is_stderr = tail[3] == 'e';
    length = i + n - p;
    return 1;
  }
  return 0;
}

// The integer after `marker` in `line` (spaces skipped), or -1.
int number_after(const std::string& line, const char* marker) {
  const size_t at = line.find(marker);
  if (at == std::string::npos) return -1;
  size_t p = at + std::strlen(marker);
  while (p < line.size() && line[p] == ' ') ++p;
  size_t q = p;
  while (q < line.size() && ::isdigit(static_cast<unsigned char>(line[q]))) ++q;
  return q > p ? std::stoi(line.substr(p, q - p)) : -1;
}

// The rank an mpirun message blames, or -1.
int rank_in_mpirun_message(const std::string& line) {
  for (const char* marker : {"MPI_ABORT was invoked on rank ", "process rank "}) {
    const int r = number_after(line, marker);
    if (r >= 0) return r;
  }
  const char* name = "Process name: [[";  // "Process name: [[J,S],R]"
  const size_t at = line.find(name);
  if (at == std::string::npos) return -1;
  const size_t p = line.find("],", at + std::strlen(name));
  return p == std::string::npos ? -1 : number_after(line.substr(p), "],");
}

void push(std::deque<std::string>& q, const std::string& l) {
  q.push_back(l);
  if (q.size() > kTailLines) q.pop_front();
}

}  // namespace

OutputRouter::OutputRouter(std::string log_dir, std::string header)
    : log_dir_(std::move(log_dir)), header_(std::move(header)) {
  mpirun_log_.open(log_dir_ + "/mpirun.log", std::ios::app);
  MOETRON_CHECK(mpirun_log_.good(), "cannot write '", log_dir_, "/mpirun.log'");
  mpirun_log_ << header_ << "\n" << std::flush;
}

void OutputRouter::feed(int pipe, const char* data, size_t n) {
  Pipe& pp = pipes_[pipe];
  pp.raw.append(data, n);
  size_t i = 0;
  while (i < pp.raw.size()) {
    const char c = pp.raw[i];
    if (c == '[') {
      int rank = 0;
      bool is_stderr = false;
      size_t len = 0;
      const int tag = parse_tag(pp.raw, i, rank, is_stderr, len);
      if (tag < 0) break;  // wait for the rest of the tag
      if (tag > 0) {
        pp.owner = {rank, is_stderr};
        i += len;
        continue;
      }
    }
    // A carriage return (progress lines: mpirun gives ranks a pty) also ends a line.
    if (c == '\n' || c == '\r') {
      std::string& line = pending_[pp.owner];
      if (c == '\n' || !line.empty()) emit(pp.owner, line);
      line.clear();
      if (c == '\n') pp.owner = {-1, true};
    } else {
      pending_[pp.owner].push_back(c);
    }
    ++i;
  }
  pp.raw.erase(0, i);
}

void OutputRouter::flush() {
  for (auto& [owner, line] : pending_) {
    if (!line.empty()) emit(owner, line);
    line.clear();
  }
}

void OutputRouter::add_error_files() {
  std::vector<std::pair<fs::file_time_type, fs::path>> files;
  for (const auto& e : fs::directory_iterator(log_dir_)) {
    if (e.path().extension() == ".error" && e.path().stem().string().starts_with("rank-")) {
      files.emplace_back(fs::last_write_time(e.path()), e.path());
    }
  }
  std::sort(files.begin(), files.end());
  for (const auto& [when, path] : files) {
    const std::string digits = path.stem().string().substr(5);
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    const int rank = std::stoi(digits);
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
      const auto& t = tails_[rank];
      if (std::find(t.begin(), t.end(), line) == t.end()) emit({rank, true}, line);
      errors_[rank] = line;
      mark_failed(rank);  // it wrote an error file: it failed, whatever mpirun forwarded
    }
  }
}

void OutputRouter::open_rank_logs(int ranks) {
  for (int r = 0; r < ranks; ++r) rank_log(r).flush();
}

void OutputRouter::note(const std::string& line) {
  mpirun_log_ << line << "\n" << std::flush;
  for (auto& [rank, log] : logs_) *log << line << "\n" << std::flush;
}

std::string OutputRouter::error_line(int rank) const {
  const auto it = errors_.find(rank);
  return it == errors_.end() ? "" : it->second;
}

std::string OutputRouter::log_path(int rank) const {
  return log_dir_ + "/rank-" + std::to_string(rank) + ".log";
}

void OutputRouter::emit(const Owner& owner, std::string line) {
  // Drop the terminal's erase-to-end-of-line that progress lines end with.
  for (size_t at; (at = line.find("\033[K")) != std::string::npos;) line.erase(at, 3);
  const auto [rank, is_stderr] = owner;
  if (rank < 0) {
    mpirun_log_ << line << "\n" << std::flush;
    push(mpirun_tail_, line);
    if (blamed_ < 0) blamed_ = rank_in_mpirun_message(line);
    if (signal_ < 0) signal_ = number_after(line, "exited on signal ");
    if (exit_code_ < 0) exit_code_ = number_after(line, "Exit code:");
    return;
  }
  rank_log(rank) << line << "\n" << std::flush;
  push(tails_[rank], line);
  if (rank == 0) (is_stderr ? std::cerr : std::cout) << line << std::endl;
  // On either stream: mpirun's forwarding under abort is not careful about which.
  if (line.starts_with("rank " + std::to_string(rank) + ": error:")) {
    errors_[rank] = line;
    mark_failed(rank);
  }
}

void OutputRouter::mark_failed(int rank) {
  if (std::find(failed_.begin(), failed_.end(), rank) == failed_.end()) failed_.push_back(rank);
}

std::ofstream& OutputRouter::rank_log(int rank) {
  auto it = logs_.find(rank);
  if (it != logs_.end()) return *it->second;
  auto f = std::make_unique<std::ofstream>(log_path(rank), std::ios::app);
  MOETRON_CHECK(f->good(), "cannot write '", log_path(rank), "'");
  *f << header_ << "\n";
  return *logs_.emplace(rank, std::move(f)).first->second;
}

void print_tail(const std::string& title, const std::deque<std::string>& lines) {
  std::cerr << title << "\n";
  for (const auto& l : lines) std::cerr << "  | " << l << "\n";
}

}  // namespace moetron::train
