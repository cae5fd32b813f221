// The output of one mpirun attempt of `moetron launch`: mpirun's two pipes
// split into lines per rank and stream (mpirun --tag-output), each rank's
// lines appended to RUN/logs/rank-R.log (rank 0's also on the console),
// mpirun's own to RUN/logs/mpirun.log; and what they say about failures:
// ranks that printed "rank R: error:" or wrote RUN/logs/rank-R.error, the
// rank mpirun blames, the signal that killed it or its exit code.
#pragma once

#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace moetron::train {

class OutputRouter {
 public:
  // `header` starts this attempt's part of every log (logs are appended).
  OutputRouter(std::string log_dir, std::string header);
  // Bytes read from pipe 0 (mpirun's stdout) or 1 (its stderr).
  void feed(int pipe, const char* data, size_t n);
  // Emits the lines still without their newline.
  void flush();
  // Errors the ranks wrote to RUN/logs/rank-R.error (write_rank_error), oldest
  // first: the rank and its message join the failures and its log, unless
  // mpirun forwarded the line before the job was killed.
  void add_error_files();
  // Every rank gets its log (with the header) even if it never prints.
  void open_rank_logs(int ranks);
  // Appends a line of the launcher's own (e.g. why it stopped the job) to
  // every open log.
  void note(const std::string& line);

  const std::vector<int>& failed_ranks() const { return failed_; }
  int blamed_by_mpirun() const { return blamed_; }
  int signal_by_mpirun() const { return signal_; }
  int exit_code_by_mpirun() const { return exit_code_; }
  const std::deque<std::string>& tail(int rank) { return tails_[rank]; }
  const std::deque<std::string>& mpirun_tail() { return mpirun_tail_; }
  // The last "rank R: error: ..." line of `rank` ("" when none).
  std::string error_line(int rank) const;
  std::string log_path(int rank) const;

 private:
  using Owner = std::pair<int, bool>;  // rank (-1: mpirun itself), stderr
  struct Pipe {
    std::string raw;
    Owner owner{-1, true};
  };
  void emit(const Owner& owner, std::string line);
  void mark_failed(int rank);
  std::ofstream& rank_log(int rank);

  std::string log_dir_, header_;
  std::ofstream mpirun_log_;
  std::map<int, Pipe> pipes_;
  std::map<Owner, std::string> pending_;
  std::map<int, std::unique_ptr<std::ofstream>> logs_;
  std::map<int, std::deque<std::string>> tails_;
  std::map<int, std::string> errors_;
  std::deque<std::string> mpirun_tail_;
  std::vector<int> failed_;
  int blamed_ = -1;
  int signal_ = -1;
  int exit_code_ = -1;
};

// Prints `title` and the lines, indented, to stderr.
void print_tail(const std::string& title, const std::deque<std::string>& lines);

}  // namespace moetron::train
