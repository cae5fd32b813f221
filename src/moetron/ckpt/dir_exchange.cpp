#include "moetron/ckpt/dir_exchange.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/core/overwrite_file.h"

namespace moetron::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr int kIndexSizeTag = 7101, kIndexTag = 7102, kChunkTag = 7103;

struct FileSpan {
  std::string path;
  int64_t bytes = 0;
};

// Reads or writes a list of files as one byte stream, a file at a time.
class FileStream {
 public:
  FileStream(std::vector<FileSpan> files, bool writing)
      : files_(std::move(files)), writing_(writing) {}
  ~FileStream() { close_current(); }
  FileStream(const FileStream&) = delete;
  FileStream& operator=(const FileStream&) = delete;

  // Moves n bytes between buf and the stream, opening each file in turn
  // (an empty file is created when the stream passes it).
  void transfer(uint8_t* buf, int64_t n) {
    while (n > 0 || (writing_ && next_ < files_.size() && at_ == files_[next_].bytes)) {
      open_next_if_done();
      const FileSpan& f = files_[next_];
      const int64_t take = std::min(n, f.bytes - at_);
      if (writing_) out_->write(buf, static_cast<size_t>(take));
      for (int64_t done = 0; !writing_ && done < take;) {
        const ssize_t k = ::read(fd_, buf + done, static_cast<size_t>(take - done));
        if (k < 0 && errno == EINTR) continue;
        MOETRON_CHECK(k > 0, "snapshot exchange: cannot read '", f.path,
                      "': ", k < 0 ? std::strerror(errno) : "it is shorter than indexed");
        done += k;
      }
      at_ += take;
      buf += take;
      n -= take;
      if (at_ == f.bytes) finish_current();
    }
  }

 private:
  void open_next_if_done() {
    if (fd_ >= 0 || out_) return;
    MOETRON_CHECK(next_ < files_.size(), "snapshot exchange: more bytes than the files indexed");
    const std::string& p = files_[next_].path;
    at_ = 0;
    // Written in place: a recycled copy keeps its pages (core/overwrite_file.h).
    if (writing_) {
      out_ = std::make_unique<OverwriteFile>(p);
      return;
    }
    fd_ = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    MOETRON_CHECK(fd_ >= 0, "snapshot exchange: cannot open '", p, "': ", std::strerror(errno));
  }
  void finish_current() {
    open_next_if_done();  // an empty file still gets created
    if (out_) out_->finish();
    close_current();
    ++next_;
    at_ = 0;
  }
  void close_current() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    out_.reset();
  }

  std::vector<FileSpan> files_;
  bool writing_;
  size_t next_ = 0;
  int64_t at_ = 0;
  int fd_ = -1;                         // reading
  std::unique_ptr<OverwriteFile> out_;  // writing
};

// [{"name", "bytes"}] of a directory's regular files, sorted by name.
nlohmann::json index_of(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  nlohmann::json index = nlohmann::json::array();
  for (const auto& n : names)
    index.push_back({{"name", n}, {"bytes", fs::file_size(dir + "/" + n)}});
  return index;
}

std::vector<FileSpan> spans(const nlohmann::json& index, const std::string& dir, bool check) {
  std::vector<FileSpan> out;
  for (const auto& e : index) {
    const std::string name = e.at("name").get<std::string>();
    const int64_t bytes = e.at("bytes").get<int64_t>();
    MOETRON_CHECK(!check || (!name.empty() && name.find('/') == std::string::npos && name != "." &&
                             name != ".." && bytes >= 0),
                  "snapshot exchange: the neighbour's index has a bad entry '", name, "'");
    out.push_back({dir + "/" + name, bytes});
  }
  return out;
}

int64_t total_bytes(const std::vector<FileSpan>& files) {
  int64_t t = 0;
  for (const auto& f : files) t += f.bytes;
  return t;
}

// Sends `out` to `to` while receiving from `from` (sizes first, then bytes).
std::string swap_text(comm::Communicator& comm, const std::string& out, int to, int from) {
  int64_t out_len = static_cast<int64_t>(out.size()), in_len = 0;
  {
    auto s = comm.send_async(Tensor::wrap(&out_len, {1}, DType::i64), to, kIndexSizeTag);
    auto r = comm.recv_async(Tensor::wrap(&in_len, {1}, DType::i64), from, kIndexSizeTag);
    s->wait();
    r->wait();
  }
  std::string in(static_cast<size_t>(in_len), '\0');
  std::string copy = out;  // send_async wants a mutable buffer
  auto s = comm.send_async(Tensor::wrap(copy.data(), {out_len}, DType::u8), to, kIndexTag);
  auto r = comm.recv_async(Tensor::wrap(in.data(), {in_len}, DType::u8), from, kIndexTag);
  s->wait();
  r->wait();
  return in;
}

// Runs `io`, keeping its first error: after a failure the transfer goes on
// (zeros sent, bytes dropped) so the pair stays in step and nobody hangs.
void keep_going(std::string& error, const std::function<void()>& io) {
  if (!error.empty()) return;
  try {
    io();
  } catch (const std::exception& e) {
    error = e.what();
  }
}

}  // namespace

ExchangeStats exchange_directory(comm::Communicator& comm, const std::string& send_dir, int to,
                                 const std::string& into, int from, int64_t chunk_bytes) {
  MOETRON_CHECK(chunk_bytes > 0, "snapshot exchange: chunk_bytes must be positive");
  const nlohmann::json mine = index_of(send_dir);
  const std::string theirs_text = swap_text(comm, mine.dump(), to, from);
  nlohmann::json theirs;
  try {
    theirs = nlohmann::json::parse(theirs_text);
  } catch (const nlohmann::json::exception& e) {
    MOETRON_FAIL("snapshot exchange: rank ", from, " sent a malformed index: ", e.what());
  }
  std::vector<FileSpan> out_files = spans(mine, send_dir, false);
  std::vector<FileSpan> in_files = spans(theirs, into, true);
  ExchangeStats st{total_bytes(out_files), total_bytes(in_files)};
  FileStream reader(std::move(out_files), false), writer(std::move(in_files), true);
  std::vector<uint8_t> send_buf(static_cast<size_t>(std::min(chunk_bytes, st.sent_bytes)));
  std::vector<uint8_t> recv_buf(static_cast<size_t>(std::min(chunk_bytes, st.received_bytes)));
  std::string read_error, write_error;
  keep_going(write_error, [&] { writer.transfer(recv_buf.data(), 0); });  // leading empty files
  int64_t sent = 0, received = 0;
  while (sent < st.sent_bytes || received < st.received_bytes) {
    const int64_t ns = std::min(chunk_bytes, st.sent_bytes - sent);
    const int64_t nr = std::min(chunk_bytes, st.received_bytes - received);
    std::unique_ptr<comm::Work> s, r;
    if (nr > 0)
      r = comm.recv_async(Tensor::wrap(recv_buf.data(), {nr}, DType::u8), from, kChunkTag);
    if (ns > 0) {
      keep_going(read_error, [&] { reader.transfer(send_buf.data(), ns); });
      s = comm.send_async(Tensor::wrap(send_buf.data(), {ns}, DType::u8), to, kChunkTag);
    }
    if (r) r->wait();
    if (nr > 0) keep_going(write_error, [&] { writer.transfer(recv_buf.data(), nr); });
    if (s) s->wait();
    sent += ns;
    received += nr;
  }
  // Whether what was sent is what the files hold: a receiver must not keep
  // a copy its sender could not read.
  const std::string verdict = swap_text(comm, read_error.empty() ? "ok" : read_error, to, from);
  MOETRON_CHECK(read_error.empty(), read_error);
  MOETRON_CHECK(write_error.empty(), write_error);
  MOETRON_CHECK(verdict == "ok", "snapshot exchange: rank ", from,
                " could not send its part: ", verdict);
  // `into` may be a recycled directory: only the files received stay.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(into, ec)) {
    const std::string name = e.path().filename().string();
    const bool received = std::any_of(theirs.begin(), theirs.end(), [&](const nlohmann::json& f) {
      return f.at("name").get<std::string>() == name;
    });
    if (!received) fs::remove_all(e.path(), ec);
  }
  return st;
}

}  // namespace moetron::ckpt
