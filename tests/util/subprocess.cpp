#include "util/subprocess.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "moetron/core/error.h"

extern char** environ;

namespace moetron::test {

Subprocess::Subprocess(const std::vector<std::string>& argv, const std::string& log_path,
                       const std::string& err_path)
    : log_path_(log_path) {
  MOETRON_CHECK(!argv.empty(), "a subprocess needs a program");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (err_path.empty()) {
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
  }
  const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw Error(str_cat("cannot start ", argv[0], ": ", std::strerror(rc)));
}

Subprocess::~Subprocess() {
  if (!reaped_) terminate();
}

bool Subprocess::reap(bool block) {
  if (reaped_) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, block ? 0 : WNOHANG);
  if (r != pid_) return false;
  reaped_ = true;
  code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return true;
}

bool Subprocess::running() {
  return !reap(false);
}

int Subprocess::wait(double seconds) {
  poll_until([this] { return reap(false); }, seconds, 0.02);
  return reaped_ ? code_ : -1;
}

int Subprocess::terminate(double grace_seconds) {
  if (reaped_) return code_;
  ::kill(pid_, SIGTERM);
  if (wait(grace_seconds) < 0) {
    ::kill(pid_, SIGKILL);
    reap(true);
  }
  return code_;
}

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  MOETRON_CHECK(fd >= 0, "socket: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  MOETRON_CHECK(ok, "cannot find a free TCP port: ", std::strerror(errno));
  return ntohs(addr.sin_port);
}

bool poll_until(const std::function<bool()>& ready, double timeout_s, double interval_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    if (ready()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::duration<double>(interval_s));
  }
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string fresh_temp_dir(const std::string& tag) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / (tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace moetron::test
