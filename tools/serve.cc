// ./x serve: the tensor-parallel inference server (serving/). Every rank runs this binary (started
// by ./x serve through tools/launch.py, or by torchrun); rank 0 also serves HTTP. Without the
// torchrun variables it serves as one process with plain tensors.
//
// --model DIR: a Hugging Face model directory (config.json, model.safetensors or its sharded
// index, tokenizer.json): Llama, Mistral, Qwen2, Qwen3 (serving/models/hf_model.h), with the
// directory's tokenizer (serving/text/), a paged KV cache of --kv-cache-memory bytes per rank and
// long prompts prefilled in --prefill-chunk pieces. Without it, the demo's model from
// --checkpoint with the byte tokenizer.
//
// --device cuda: the weights, the KV cache and every step run on this rank's GPU (LOCAL_RANK %
// GPUs, as PyTorch's init_device_mesh picks it), the ranks on NCCL, or on cuda_ipc when they
// outnumber the host's GPUs (collectives::default_backend; $DTENSOR_BACKEND overrides); the
// logits come back to the host for sampling, one copy per step.
//
//   serve --model DIR [--dtype bfloat16] [--kv-cache-memory 1G] [--block-size 16]
//         [--prefill-chunk 512] [--context N]   (N: default the model's max_position_embeddings)
//   serve --checkpoint DIR [--vocab 512 --dim 128 --heads 8 --hidden 384] [--context 256]
//   both: [--port 8000] [--host 127.0.0.1] [--max-batch 8] [--max-queue 32] [--port-file FILE]
//         [--profile] [--device cpu|cuda]
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
#include "serving/models/hf_model.h"
#include "serving/scheduler.h"
#include "serving/text/hf_tokenizer.h"
#include "serving/tokenizer.h"
#include "tools/cli_args.h"
#include "tools/llama_flags.h"

ABSL_FLAG(std::string, model, "",
          "Hugging Face model directory (Llama, Mistral, Qwen2, Qwen3); else --checkpoint");
ABSL_FLAG(std::string, checkpoint, "", "checkpoint directory of the demo's model");
ABSL_FLAG(std::string, dtype, "",
          "--model: weights' dtype (float32, bfloat16, float16; default: config.json's)");
ABSL_FLAG(std::string, kv_cache_memory, "512M",
          "--model: KV cache bytes per rank (suffix K, M or G)");
ABSL_FLAG(int64_t, block_size, 16, "--model: KV cache block size (positions)");
ABSL_FLAG(int64_t, prefill_chunk, 512, "--model: prompt tokens per forward pass (chunked prefill)");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(int32_t, port, 8000, "HTTP port (0: any free port; see --port-file)");
ABSL_FLAG(std::string, port_file, "", "write the bound port to this file once serving");
ABSL_FLAG(int64_t, max_batch, 8, "requests decoded together (KV cache slots)");
ABSL_FLAG(int64_t, max_queue, 32, "requests waiting for a slot; more get 429");
ABSL_FLAG(int64_t, context, 0,
          "context length: prompt plus generated tokens (0: the model's, 256 for the demo's)");
ABSL_FLAG(bool, profile, false,
          "time each decode step's local kernels and collectives (/metrics; NOTE [step profile])");

namespace {

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

// "512M" -> 536870912: an integer with an optional K, M or G (powers of 1024).
int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  const std::string unit = text.substr(std::min(used, text.size()));
  const int shift = unit.empty() ? 0 : unit == "K" ? 10 : unit == "M" ? 20 : unit == "G" ? 30 : -1;
  if (n <= 0 || shift < 0) {
    throw dtensor::Error("--kv-cache-memory must be a positive byte count (e.g. 512M, 2G), got '" +
                         text + "'");
  }
  return n << shift;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dtensor;
  using namespace dtensor::serving;
  cli::parse_command_line(
      argc, argv,
      "./x serve: a tensor-parallel LLM server (OpenAI completions API).\n"
      "  serve --model HF_DIR | --checkpoint DIR [--port 8000] [--max-batch 8]");
  const std::string model_dir = absl::GetFlag(FLAGS_model);
  const std::string checkpoint = absl::GetFlag(FLAGS_checkpoint);
  if (model_dir.empty() == checkpoint.empty()) {
    std::fprintf(stderr, "serve: give one of --model HF_DIR and --checkpoint DIR\n");
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

  const int64_t max_batch = absl::GetFlag(FLAGS_max_batch);
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    if (!model_dir.empty()) {
      HfModelOptions o;
      if (!absl::GetFlag(FLAGS_dtype).empty())
        o.dtype = dtype_from_name(absl::GetFlag(FLAGS_dtype));
      o.max_batch = max_batch;
      o.device = ranks.device;
      o.kv_cache_bytes = parse_bytes(absl::GetFlag(FLAGS_kv_cache_memory));
      o.block_size = absl::GetFlag(FLAGS_block_size);
      o.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
      o.max_context = absl::GetFlag(FLAGS_context);
      tokenizer = load_hf_tokenizer(model_dir);
      auto hf = std::make_unique<HfModel>(model_dir, ranks.mesh, o);
      if (tokenizer->vocab_size() > hf->vocab()) {
        throw Error(c10::str(model_dir, ": the tokenizer knows ", tokenizer->vocab_size(),
                             " ids, the model's vocab_size is ", hf->vocab()));
      }
      model = std::move(hf);
    } else {
      const int64_t context = absl::GetFlag(FLAGS_context);
      const LlamaConfig config = tools::llama_config_from_flags(context > 0 ? context : 256);
      auto llama = std::make_unique<Llama>(config, ranks.mesh, max_batch, ranks.device);
      llama->load(checkpoint);
      tokenizer = std::make_unique<ByteTokenizer>(config.vocab);
      model = std::move(llama);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve: rank %lld: %s\n", static_cast<long long>(rank), e.what());
    return 1;
  }
  Metrics metrics;
  {
    const MemoryUse m = model->memory();
    metrics.memory(m.weights_local, m.weights_total, m.kv_cache_local);
  }
  SchedulerOptions sopts;
  sopts.max_batch = max_batch;
  sopts.max_queue = absl::GetFlag(FLAGS_max_queue);
  sopts.profile = absl::GetFlag(FLAGS_profile);
  Scheduler scheduler(*model, *tokenizer, metrics, sopts, rank == 0);

  std::unique_ptr<HttpServer> http;
  std::atomic<bool> done{false};
  std::thread watcher;
  if (rank == 0) {
    HttpOptions hopts;
    hopts.host = absl::GetFlag(FLAGS_host);
    hopts.port = absl::GetFlag(FLAGS_port);
    hopts.context_length = model->max_context();
    if (!model_dir.empty()) {
      const std::string trimmed = model_dir.substr(0, model_dir.find_last_not_of('/') + 1);
      hopts.model_name = trimmed.substr(trimmed.find_last_of('/') + 1);
    }
    hopts.ranks = world;
    http = std::make_unique<HttpServer>(scheduler, *tokenizer, metrics, hopts);
    http->start();
    const std::string port_file = absl::GetFlag(FLAGS_port_file);
    if (!port_file.empty()) {
      std::ofstream(port_file + ".tmp") << http->port() << "\n";
      std::rename((port_file + ".tmp").c_str(), port_file.c_str());
    }
    std::printf("serving %s on http://%s:%d/v1/completions (%lld ranks, max batch %lld, %s)\n",
                (model_dir.empty() ? checkpoint : model_dir).c_str(), hopts.host.c_str(),
                http->port(), static_cast<long long>(world), static_cast<long long>(max_batch),
                model->device().str().c_str());
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
