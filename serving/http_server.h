#pragma once
// Rank 0's HTTP front end (Debian's cpp-httplib): POST /v1/completions (NOTE [completions
// fields]; JSON or server-sent events), POST /v1/chat/completions (NOTE [chat completions]), GET
// /v1/models, GET /health, GET /metrics. Requests are checked here and only valid ones reach the
// scheduler; refusals are counted in the metrics.

#include <memory>
#include <string>
#include <thread>

#include "serving/metrics.h"
#include "serving/scheduler.h"
#include "serving/tokenizer.h"

namespace httplib {
class Server;
}

namespace dtensor::serving {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (port() says which)
  std::string model_name = "dtensor-llama";
  int64_t context_length = 256;
  int threads = 64;  // connections served at once (a streaming request holds one)
  size_t max_body_bytes = 1 << 20;
  int64_t ranks = 1;
};

class HttpServer {
 public:
  HttpServer(Scheduler& scheduler, const Tokenizer& tokenizer, Metrics& metrics,
             HttpOptions options);
  ~HttpServer();
  // Binds and starts serving on a thread; throws when the address cannot be bound.
  void start();
  // Stops accepting and joins the thread.
  void stop();
  int port() const { return port_; }

 private:
  Scheduler& scheduler_;
  const Tokenizer& tokenizer_;
  Metrics& metrics_;
  HttpOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace dtensor::serving
