#include "serving/http_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace dtensor::serving {
namespace {

using nlohmann::json;
constexpr std::chrono::milliseconds kPoll{100};

void send_error(httplib::Response& res, Metrics& metrics, const ApiError& e) {
  metrics.request_rejected(e.status);
  res.status = e.status;
  res.set_content(error_body(e), "application/json");
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string next_id() {
  static std::atomic<int64_t> n{0};
  return "cmpl-" + std::to_string(unix_now()) + "-" + std::to_string(++n);
}

}  // namespace

HttpServer::HttpServer(Scheduler& scheduler, const Tokenizer& tokenizer, Metrics& metrics,
                       HttpOptions options)
    : scheduler_(scheduler),
      tokenizer_(tokenizer),
      metrics_(metrics),
      options_(std::move(options)),
      server_(std::make_unique<httplib::Server>()) {
  httplib::Server& s = *server_;
  const int threads = options_.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  s.set_payload_max_length(options_.max_body_bytes);

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (scheduler_.healthy()) {
      res.set_content(
          json{{"status", scheduler_.draining() ? "draining" : "ok"}, {"ranks", options_.ranks}}
              .dump(),
          "application/json");
      if (scheduler_.draining()) res.status = 503;
    } else {
      res.status = 503;
      res.set_content(json{{"status", "unhealthy"}, {"error", scheduler_.health_error()}}.dump(
                          -1, ' ', false, json::error_handler_t::replace),
                      "application/json");
    }
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.text(), "text/plain; version=0.0.4");
  });

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"object", "list"},
                         {"data",
                          {{{"id", options_.model_name},
                            {"object", "model"},
                            {"owned_by", "dtensor"},
                            {"max_model_len", options_.context_length}}}}}
                        .dump(),
                    "application/json");
  });

  // One parsed request (a completion or a chat completion) through the scheduler to the client.
  const auto serve = [this](std::variant<CompletionRequest, ApiError> parsed,
                            httplib::Response& res) {
    if (auto* e = std::get_if<ApiError>(&parsed)) return send_error(res, metrics_, *e);
    const std::string id = next_id();
    const int64_t created = unix_now();
    auto req = std::make_shared<Request>(id, std::move(std::get<CompletionRequest>(parsed)));
    switch (scheduler_.submit(req)) {
      case Scheduler::Admit::kOk:
        break;
      case Scheduler::Admit::kQueueFull:
        return send_error(res, metrics_,
                          {429, "too many concurrent requests: the queue is full; retry later", "",
                           "rate_limit_error"});
      case Scheduler::Admit::kUnavailable:
        return send_error(
            res, metrics_,
            {503,
             scheduler_.healthy() ? "the server is shutting down"
                                  : "the model's ranks failed: " + scheduler_.health_error(),
             "", "service_unavailable"});
    }
    const int64_t prompt_tokens = static_cast<int64_t>(req->params().prompt.size());
    const std::string model = options_.model_name;
    const bool chat = req->params().chat;
    if (!req->params().stream) {
      std::string text;
      std::vector<int64_t> ids;
      while (true) {
        const auto ev = req->next(kPoll);
        if (!ev) continue;
        text += ev->text;
        ids.insert(ids.end(), ev->token_ids.begin(), ev->token_ids.end());
        if (ev->status != 200) {
          res.status = ev->status;
          res.set_content(error_body({ev->status, ev->error, "", "service_unavailable"}),
                          "application/json");
          return;
        }
        if (!ev->finish_reason.empty()) {
          const Usage usage{prompt_tokens, static_cast<int64_t>(ids.size())};
          res.set_content(
              chat ? chat_completion_body(id, created, model, text, ids, ev->finish_reason, usage)
                   : completion_body(id, created, model, text, ids, ev->finish_reason, usage),
              "application/json");
          return;
        }
      }
    }
    auto generated = std::make_shared<int64_t>(0);
    res.set_chunked_content_provider(
        "text/event-stream",
        [req, id, created, model, prompt_tokens, generated, chat](size_t, httplib::DataSink& sink) {
          while (true) {
            if (!sink.is_writable()) {
              req->cancel();
              return false;
            }
            const auto ev = req->next(kPoll);
            if (!ev) continue;
            std::string out;
            if (ev->status != 200) {
              out = "data: " + error_body({ev->status, ev->error, "", "service_unavailable"}) +
                    "\n\n" + stream_done();
            } else {
              const bool first = *generated == 0;
              *generated += static_cast<int64_t>(ev->token_ids.size());
              const auto usage = ev->final()
                                     ? std::optional<Usage>(Usage{prompt_tokens, *generated})
                                     : std::nullopt;
              out = chat ? chat_stream_chunk(id, created, model, ev->text, ev->token_ids,
                                             ev->finish_reason, usage, first)
                         : stream_chunk(id, created, model, ev->text, ev->token_ids,
                                        ev->finish_reason, usage);
              if (ev->final()) out += stream_done();
            }
            if (!sink.write(out.data(), out.size())) {
              req->cancel();
              return false;
            }
            if (ev->final()) {
              sink.done();
              return true;
            }
          }
        },
        [req](bool success) {
          if (!success) req->cancel();
        });
  };
  s.Post("/v1/completions", [this, serve](const httplib::Request& http, httplib::Response& res) {
    serve(parse_completion_request(http.body, tokenizer_, options_.context_length), res);
  });
  s.Post("/v1/chat/completions",
         [this, serve](const httplib::Request& http, httplib::Response& res) {
           serve(parse_chat_request(http.body, tokenizer_, options_.context_length), res);
         });

  s.set_error_handler([](const httplib::Request& http, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string msg = res.status == 413 ? "the request body is too large"
                            : res.status == 404
                                ? "no such endpoint: " + http.method + " " + http.path
                                : "HTTP error " + std::to_string(res.status);
    res.set_content(error_body({res.status, msg, "", "invalid_request_error"}), "application/json");
  });
  s.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string msg = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          msg = e.what();
        } catch (...) {
        }
        res.status = 500;
        res.set_content(error_body({500, msg, "", "internal_error"}), "application/json");
      });
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
    DTENSOR_CHECK(port_ > 0, "serve: cannot bind an HTTP port on ", options_.host);
  } else {
    DTENSOR_CHECK(server_->bind_to_port(options_.host, options_.port), "serve: cannot bind ",
                  options_.host, ":", options_.port, " (in use?)");
    port_ = options_.port;
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
}

void HttpServer::stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace dtensor::serving
