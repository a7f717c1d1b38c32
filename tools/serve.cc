// ./x serve: the tensor-parallel inference server (serving/). Every rank runs this binary (started
// by
// ./x serve through tools/launch.py, or by torchrun); rank 0 also serves HTTP. Without the
// torchrun variables it serves as one process with plain tensors.
//
// --device cuda: the weights, the KV cache and every step run on this rank's GPU (LOCAL_RANK %
// GPUs, as PyTorch's init_device_mesh picks it), the ranks on NCCL, or on cuda_ipc when they
// outnumber the host's GPUs (collectives::default_backend; $DTENSOR_BACKEND overrides); the
// logits come back to the host for sampling, one copy per step.
//
//   serve --checkpoint DIR [--port 8000] [--host 127.0.0.1] [--max-batch 8] [--max-queue 32]
//         [--context 256] [--port-file FILE] [--profile] [--device cpu|cuda]
//         [--vocab 512 --dim 128 --heads 8 --hidden 384]   (the model's sizes; the demo's by
//         default)
//
// SIGTERM (or SIGINT) on rank 0 drains: new requests get 503, the admitted ones finish, then
// every rank exits 0. The other ranks ignore SIGTERM and leave when rank 0 says so (NOTE [step
// plans]); if rank 0 dies they fail at their next collective.

#include <ATen/Parallel.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "collectives/launch_env.h"
#include "dtensor/api.h"
#include "serving/http_server.h"
#include "serving/llama.h"
#include "serving/scheduler.h"
#include "serving/tokenizer.h"
#include "tools/cli_args.h"
#include "tools/llama_flags.h"

ABSL_FLAG(std::string, checkpoint, "", "checkpoint directory of the demo's model (required)");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(int32_t, port, 8000, "HTTP port (0: any free port; see --port-file)");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file once serving");
ABSL_FLAG(int64_t, max_batch, 8, "requests decoded together (KV cache slots)");
ABSL_FLAG(int64_t, max_queue, 32, "requests waiting for a slot; more get 429");
ABSL_FLAG(int64_t, context, 256, "context length: prompt plus generated tokens");
ABSL_FLAG(bool, profile, false,
          "time each decode step's local kernels and collectives (/metrics; NOTE [step profile])");

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

}  // namespace

int main(int argc, char** argv) {
  using namespace dtensor;
  using namespace dtensor::serving;
  cli::parse_command_line(argc, argv,
                          "./x serve: a tensor-parallel Llama server (OpenAI completions API).\n"
                          "  serve --checkpoint DIR [--port 8000] [--max-batch 8]");
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  if (checkpoint.empty()) {
    std::fprintf(stderr, "serve: --checkpoint DIR is required\n");
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  at::set_num_threads(1);
  tools::LaunchedRanks ranks;
  try {
    ranks = tools::join_launched_ranks(tools::device_type_from_flags());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve: --device %s: %s\n", absl::GetFlag(FLAGS_device).c_str(), e.what());
    return 2;
  }
  const int64_t world = ranks.world(), rank = ranks.rank();
  if (rank == 0) {
    ::signal(SIGTERM, on_signal);
    ::signal(SIGINT, on_signal);
  } else {
    ::signal(SIGTERM, SIG_IGN);
  }

  const LlamaConfig config = tools::llama_config_from_flags(absl::GetFlag(FLAGS_context));
  const int64_t max_batch = absl::GetFlag(FLAGS_max_batch);
  Llama model(config, ranks.mesh, max_batch, ranks.device);
  model.load(checkpoint);
  ByteTokenizer tokenizer(config.vocab);
  Metrics metrics;
  {
    const auto bytes = [](const at::Tensor& t) {
      const at::Tensor local = api::is_dtensor(t) ? api::local(t) : t;
      return local.numel() * static_cast<int64_t>(local.element_size());
    };
    int64_t weights = 0, total = 0;
    for (const auto& [key, w] : model.weights()) {
      weights += bytes(w);
      total += w.numel() * static_cast<int64_t>(w.element_size());
    }
    metrics.memory(weights, total, bytes(model.k_cache(0)) * 2 * max_batch);
  }
  SchedulerOptions sopts;
  sopts.max_batch = max_batch;
  sopts.max_queue = absl::GetFlag(FLAGS_max_queue);
  sopts.profile = absl::GetFlag(FLAGS_profile);
  Scheduler scheduler(model, tokenizer, metrics, sopts, rank == 0);

  std::unique_ptr<HttpServer> http;
  std::atomic<bool> done{false};
  std::thread watcher;
  if (rank == 0) {
    HttpOptions hopts;
    hopts.host = absl::GetFlag(FLAGS_host);
    hopts.port = absl::GetFlag(FLAGS_port);
    hopts.context_length = config.max_seq;
    hopts.ranks = world;
    http = std::make_unique<HttpServer>(scheduler, tokenizer, metrics, hopts);
    http->start();
    const std::string port_file = absl::GetFlag(FLAGS_port_file);
    if (!port_file.empty()) {
      std::ofstream(port_file + ".tmp") << http->port() << "\n";
      std::rename((port_file + ".tmp").c_str(), port_file.c_str());
    }
    std::printf("serving %s on http://%s:%d/v1/completions (%lld ranks, max batch %lld, %s)\n",
                checkpoint.c_str(), hopts.host.c_str(), http->port(), static_cast<long long>(world),
                static_cast<long long>(max_batch), model.device().str().c_str());
    std::fflush(stdout);
    watcher = std::thread([&] {
      while (!done) {
        if (g_signal != 0) scheduler.drain();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  int code = 0;
  try {
    scheduler.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve: rank %lld: %s\n", static_cast<long long>(rank), e.what());
    return 1;
  }
  if (rank == 0) {
    if (!scheduler.healthy()) {
      // NOTE [unhealthy server]: a rank failed. /health stays red and requests get 503 until the
      // server is stopped, so a load balancer sees why; then the exit status says it failed.
      std::fprintf(stderr, "serve: the ranks failed: %s\n", scheduler.health_error().c_str());
      while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      code = 1;
    } else {
      std::printf("serve: drained, exiting\n");
    }
    done = true;
    watcher.join();
    http->stop();
  }
  std::fflush(stdout);
  return code;
}
