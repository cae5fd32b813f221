#include "moetron/monitor/http_server.h"

#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "moetron/core/error.h"
#include "moetron/monitor/dashboard_assets.h"
#include "moetron/monitor/prometheus_text.h"

namespace moetron::monitor {

namespace {

constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";
constexpr size_t kMaxPage = 1000000;

// Why host:port cannot be bound, asked of the kernel directly (cpp-httplib
// only says that it failed): "address already in use", "cannot assign
// requested address", or the resolver's message for an unknown host.
std::string bind_failure_reason(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return str_cat("cannot resolve host '", host, "': ", ::gai_strerror(rc));
  }
  std::string reason = "cannot bind";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      reason = std::strerror(errno);
      continue;
    }
    const int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    const bool bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    const int err = errno;
    ::close(fd);
    reason = bound ? "bound on retry, then failed in the HTTP server" : std::strerror(err);
    if (!bound) break;
  }
  ::freeaddrinfo(res);
  // strerror says "Address already in use": the message keeps one case.
  for (char& c : reason) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return reason;
}

// Compact JSON; invalid UTF-8 in a string is replaced rather than thrown on
// (a metric's label may come from user data).
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The integer query parameter `name`, or `fallback` when absent; false when
// it is present but not an integer.
bool int_param(const httplib::Request& req, const char* name, int64_t fallback, int64_t* out) {
  *out = fallback;
  if (!req.has_param(name)) return true;
  const std::string v = req.get_param_value(name);
  try {
    size_t used = 0;
    *out = std::stoll(v, &used);
    return used == v.size();
  } catch (const std::exception&) {
    return false;
  }
}

// Answers GET /api/...?since=K&limit=N from `history`.
void serve_page(const LineHistory& history, const httplib::Request& req, httplib::Response& res) {
  int64_t since = 0, limit = 0;
  if (!int_param(req, "since", -1, &since) ||
      !int_param(req, "limit", static_cast<int64_t>(kMaxPage), &limit) || limit < 1) {
    res.status = 400;
    res.set_content("since and limit must be integers (limit >= 1)\n", "text/plain");
    return;
  }
  HistoryPage page = history.after(since, static_cast<size_t>(std::min<int64_t>(limit, kMaxPage)));
  res.set_header("Cache-Control", "no-store");
  res.set_header("X-Moetron-Last", std::to_string(page.last_key));
  res.set_content(std::move(page.json), "application/json");
}

}  // namespace

MonitorServer::MonitorServer(const Registry& registry, ServerOptions opts)
    : registry_(registry),
      opts_(std::move(opts)),
      steps_(opts_.history_limit, opts_.history_max_bytes, HistoryOverflow::thin),
      events_(opts_.event_limit, opts_.history_max_bytes, HistoryOverflow::drop_oldest),
      server_(std::make_unique<httplib::Server>()) {
  MOETRON_CHECK(opts_.port >= 0 && opts_.port <= 65535, "monitor.port must be in 0..65535, got ",
                opts_.port);
  MOETRON_CHECK(opts_.threads >= 1, "the monitor server needs a request thread");
  const int threads = opts_.threads;
  server_->new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, with which a
  // second run on the same port would bind too and get half the scrapes.
  server_->set_socket_options([](int sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Without TCP_NODELAY a gzip answer's last chunk waits for the client's
  // delayed ACK: ~40 ms a scrape on a kept-alive connection, which is how
  // Prometheus scrapes (bench/RESULTS.md, "/metrics scrape latency").
  server_->set_tcp_nodelay(true);
  add_routes();
  if (opts_.port == 0) {
    port_ = server_->bind_to_any_port(opts_.host);
  } else if (server_->bind_to_port(opts_.host, opts_.port)) {
    port_ = opts_.port;
  }
  if (port_ <= 0) {
    throw Error(str_cat("monitor.port ", opts_.port, ": ",
                        bind_failure_reason(opts_.host, opts_.port), " (host ", opts_.host, ")"));
  }
  thread_ = std::thread([this] {
    server_->listen_after_bind();
    listen_returned_ = true;
  });
  // stop() is a no-op until the server runs: wait for it, so that a server
  // destroyed at once still stops. The socket already listens, so nothing
  // that connects meanwhile is refused.
  while (!server_->is_running() && !listen_returned_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (listen_returned_) {
    thread_.join();
    throw Error(str_cat("monitor.port ", port_, ": the HTTP server stopped as it started"));
  }
}

MonitorServer::~MonitorServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void MonitorServer::add_routes() {
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_text(registry_.snapshot()), kPrometheusContentType);
  });
  server_->Get("/api/history", [this](const httplib::Request& req, httplib::Response& res) {
    serve_page(steps_, req, res);
  });
  server_->Get("/api/events", [this](const httplib::Request& req, httplib::Response& res) {
    serve_page(events_, req, res);
  });
  server_->Get("/api/status", [this](const httplib::Request&, httplib::Response& res) {
    nlohmann::json s = {{"latest_step", nlohmann::json()},
                        {"steps", steps_.size()},
                        {"events", events_.size()},
                        {"history_bytes", steps_.bytes()}};
    if (steps_.size() > 0) s["latest_step"] = steps_.last_key(0);
    res.set_header("Cache-Control", "no-store");
    res.set_content(s.dump(), "application/json");
  });
  for (const DashboardAsset& a : dashboard_assets()) {
    server_->Get(std::string(a.path), [a](const httplib::Request&, httplib::Response& res) {
      res.set_content(a.body.data(), a.body.size(), std::string(a.content_type).c_str());
    });
  }
}

void MonitorServer::publish_step(const nlohmann::json& line) {
  MOETRON_CHECK(line.is_object() && line.contains("step") && line["step"].is_number_integer(),
                "a published step line needs an integer \"step\"");
  steps_.append(line["step"].get<int64_t>(), dump(line));
}

void MonitorServer::publish_event(const nlohmann::json& event) {
  MOETRON_CHECK(event.is_object(), "a published event must be a JSON object");
  std::lock_guard<std::mutex> lock(events_mu_);
  events_.append(next_event_++, dump(event));
}

}  // namespace moetron::monitor
