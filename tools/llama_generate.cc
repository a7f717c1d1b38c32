// llama_generate: greedy generation with the demo's Llama-style model (serving/llama.h) from a
// checkpoint, on N ranks as threads of this process (tensor parallelism) or on one process; when
// launched (./x launch, torchrun: RANK and WORLD_SIZE set) the launched processes are the ranks.
//
//   llama_generate --checkpoint out/checkpoints/llama --prompt 1,2,3 --max_new_tokens 8 --ranks 2
//   llama_generate --device cuda ...   (the model on the GPU; launched ranks on NCCL or cuda_ipc,
//                                       collectives::default_backend)
//
// prints {"tokens":[...]} (the new tokens) on stdout, and with --timing the prefill and per-step
// decode times of rank 0 on stderr (--batch N: N copies of the prompt decoded as one batch).

#include <ATen/Parallel.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "base/error.h"
#include "collectives/functional.h"
#include "collectives/launch_env.h"
#include "collectives/rank_context.h"
#include "dtensor/api.h"
#include "dtensor/engine_activity.h"
#include "serving/llama.h"
#include "tools/cli_args.h"
#include "tools/llama_flags.h"

ABSL_FLAG(std::string, checkpoint, "",
          "checkpoint directory (dtensor.checkpoint / checkpoint::save)");
ABSL_FLAG(std::string, prompt, "", "prompt token ids, comma-separated, e.g. 1,2,3");
ABSL_FLAG(int64_t, max_new_tokens, 16, "tokens to generate");
ABSL_FLAG(int64_t, ranks, 1, "tensor-parallel ranks as threads (1: one process, plain tensors)");
ABSL_FLAG(int64_t, max_seq, 256, "KV cache length per slot");
ABSL_FLAG(int64_t, batch, 1, "copies of the prompt generated together (batched decode)");
ABSL_FLAG(bool, timing, false, "print prefill and per-token decode times (rank 0) on stderr");

namespace {

namespace serving = dtensor::serving;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Greedy generation on this rank's model, timed (the same steps as serving::greedy_generate),
// for `batch` copies of the prompt decoded together (one batched forward per step); returns the
// first copy's tokens and checks that every copy generated the same.
std::vector<int64_t> generate(serving::Llama& model, const std::vector<int64_t>& prompt,
                              int64_t max_new, int64_t batch, bool report) {
  std::vector<std::vector<int64_t>> out(batch);
  if (max_new <= 0) return {};
  std::vector<serving::Sequence> seqs;
  for (int64_t i = 0; i < batch; ++i) seqs.push_back({model.alloc_slot(), prompt, 0});
  auto t0 = Clock::now();
  at::Tensor logits = model.forward(seqs);
  const double prefill_ms = ms_since(t0);
  // NOTE [step profile] (serving/metrics.h): the decode steps' local kernels and collectives.
  const dtensor::LocalKernelClock kernels;
  const dtensor::collectives::CommCounter comms;
  double forward_ms = 0;
  t0 = Clock::now();
  for (int64_t step = 0;; ++step) {
    for (int64_t i = 0; i < batch; ++i) out[i].push_back(serving::greedy_token(logits[i]));
    if (static_cast<int64_t>(out[0].size()) == max_new) break;
    for (int64_t i = 0; i < batch; ++i) {
      seqs[i].tokens = {out[i].back()};
      seqs[i].start = static_cast<int64_t>(prompt.size()) + step;
    }
    const auto f0 = Clock::now();
    logits = model.forward(seqs);
    forward_ms += ms_since(f0);
  }
  const double decode_ms = ms_since(t0);
  for (const serving::Sequence& s : seqs) model.free_slot(s.slot);
  for (int64_t i = 1; i < batch; ++i) {
    DTENSOR_CHECK(out[i] == out[0], "llama_generate: copy ", i,
                  " of the prompt generated other tokens");
  }
  if (report) {
    const auto per_step = [&](double ms) { return max_new > 1 ? ms / (max_new - 1) : 0.0; };
    std::fprintf(stderr,
                 "prefill %lld x %zu tokens: %.2f ms; decode (batch %lld): %.3f ms/step over %lld "
                 "steps",
                 static_cast<long long>(batch), prompt.size(), prefill_ms,
                 static_cast<long long>(batch), per_step(decode_ms),
                 static_cast<long long>(max_new - 1));
    // Distributed: where a step goes (NOTE [step profile] in serving/metrics.h); one process
    // runs plain tensors, all kernels.
    if (model.distributed()) {
      std::fprintf(stderr, " (local kernels %.3f, collectives %.3f, engine %.3f ms/step)",
                   per_step(kernels.seconds() * 1e3), per_step(comms.seconds() * 1e3),
                   per_step(forward_ms - (kernels.seconds() + comms.seconds()) * 1e3));
    }
    std::fprintf(stderr, "\n");
  }
  return out[0];
}

}  // namespace

int main(int argc, char** argv) {
  dtensor::cli::parse_command_line(
      argc, argv,
      "greedy generation with the demo's Llama model from a checkpoint:\n"
      "  llama_generate --checkpoint DIR --prompt 1,2,3 --max_new_tokens N [--ranks N]");
  try {
    const std::string dir = absl::GetFlag(FLAGS_checkpoint);
    const std::vector<int64_t> prompt =
        dtensor::cli::parse_ints("--prompt", absl::GetFlag(FLAGS_prompt));
    if (dir.empty() || prompt.empty()) {
      std::cerr << "llama_generate: --checkpoint and --prompt are required\n";
      return 2;
    }
    const serving::LlamaConfig config =
        dtensor::tools::llama_config_from_flags(absl::GetFlag(FLAGS_max_seq));
    const int64_t ranks = absl::GetFlag(FLAGS_ranks);
    const int64_t max_new = absl::GetFlag(FLAGS_max_new_tokens);
    const bool timing = absl::GetFlag(FLAGS_timing);
    const int64_t batch = absl::GetFlag(FLAGS_batch);
    if (batch < 1) {
      std::cerr << "llama_generate: --batch must be at least 1\n";
      return 2;
    }
    const c10::DeviceType device_type = dtensor::tools::device_type_from_flags();
    const bool launched = dtensor::collectives::launch_env_from_environ().has_value();
    if (device_type != c10::DeviceType::CPU && ranks > 1 && !launched) {
      std::cerr << "llama_generate: --device " << absl::GetFlag(FLAGS_device)
                << " runs ranks as launched processes (./x launch -n N), not --ranks\n";
      return 2;
    }
    std::vector<int64_t> tokens;
    bool print = true;
    const dtensor::tools::LaunchedRanks joined = dtensor::tools::join_launched_ranks(device_type);
    if (launched || ranks == 1) {  // the launched ranks, or one process with plain tensors
      serving::Llama model(config, joined.mesh, batch, joined.device);
      model.load(dir);
      print = joined.rank() == 0;
      tokens = generate(model, prompt, max_new, batch, timing && print);
    } else {
      // Ranks are threads: one intra-op thread each, so they do not compete for the cores.
      at::set_num_threads(1);
      dtensor::collectives::run_threads(ranks, [&](int64_t rank) {
        const dtensor::DeviceMesh mesh = dtensor::api::init_device_mesh({ranks});
        serving::Llama model(config, mesh, batch);
        model.load(dir);
        std::vector<int64_t> mine = generate(model, prompt, max_new, batch, timing && rank == 0);
        if (rank == 0) tokens = mine;
      });
    }
    if (!print) return 0;
    std::string json = "{\"tokens\":[";
    for (size_t i = 0; i < tokens.size(); ++i) {
      json += (i ? "," : "") + std::to_string(tokens[i]);
    }
    std::cout << json << "]}" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "llama_generate: " << e.what() << "\n";
    return 1;
  }
}
