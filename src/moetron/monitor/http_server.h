// The monitor's HTTP server (cpp-httplib): Prometheus scrapes /metrics, a
// browser opens the live dashboard at /. It runs on its own threads; the
// training thread only publishes lines into an in-memory history.
//
//   GET /metrics                the registry in the Prometheus text format 0.0.4
//   GET /                       the dashboard page (and its /dashboard.*, /chart.js)
//   GET /api/history?since=S    JSON array of the published step lines with step > S
//   GET /api/events?since=N     JSON array of the published events after event N
//                               (events are numbered 0, 1, ... in publication order)
//   GET /api/status             {"latest_step", "steps", "events", "history_bytes"}
// The /api/ answers carry `X-Moetron-Last`: the key (step or event number) of
// their last element, to pass as the next `since`; `limit=N` caps the count.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "moetron/monitor/line_history.h"
#include "moetron/monitor/metric_registry.h"

namespace httplib {
class Server;
}

namespace moetron::monitor {

struct ServerOptions {
  std::string host = "127.0.0.1";  // "0.0.0.0" serves every interface
  int port = 9464;                 // 0: any free port (tests); port() says which
  size_t history_limit = 100000;   // step lines kept for the dashboard (thinned beyond)
  size_t history_max_bytes = size_t{256} << 20;  // and their text's bound
  size_t event_limit = 10000;                    // events kept (the oldest dropped beyond)
  int threads = 6;                               // request workers
};

class MonitorServer {
 public:
  // Binds host:port and starts serving before it returns. Throws
  // moetron::Error naming the port and the reason ("monitor.port 9464:
  // address already in use") when it cannot bind. `registry` must outlive
  // the server.
  MonitorServer(const Registry& registry, ServerOptions opts);
  // Stops accepting, finishes the requests in flight and joins the threads.
  ~MonitorServer();
  MonitorServer(const MonitorServer&) = delete;
  MonitorServer& operator=(const MonitorServer&) = delete;

  // One metrics.jsonl line (an object with an integer "step"), kept for the
  // dashboard. Thread-safe; costs one serialisation of the line.
  void publish_step(const nlohmann::json& line);
  // One events.jsonl object. Thread-safe.
  void publish_event(const nlohmann::json& event);

  int port() const { return port_; }
  const std::string& host() const { return opts_.host; }

 private:
  void add_routes();

  const Registry& registry_;
  ServerOptions opts_;
  LineHistory steps_;
  LineHistory events_;
  int64_t next_event_ = 0;  // guarded by events_mu_
  std::mutex events_mu_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};
  int port_ = 0;
};

}  // namespace moetron::monitor
