// hf_logits: the serving model of a Hugging Face directory (serving/models/hf_model.h) run on
// given prompts, for hf_models_test.py to compare with transformers. All prompts are prefilled in
// one batched forward (every position's logits), then `--steps` batched greedy decode steps
// follow. Rank 0 writes a safetensors file: prefill.<i> [prompt_i, vocab], decode.<i>
// [steps, vocab] (the logits of each decode step) and tokens.<i> [steps + 1] (the greedy tokens);
// every rank r writes <out>.bytes_read.<r>: the bytes of weights it read from the files.
// When launched (./x launch) the launched processes are the tensor-parallel ranks; else one
// process with plain tensors. Before the prompts, a throwaway sequence fills and frees cache
// blocks, so the prompts run on reused blocks. With --device cuda the model runs on this rank's
// GPU (launched ranks on NCCL, or cuda_ipc when they share one: tools/llama_flags.h), what
// tools/gpu/check.sh's hf stage compares with transformers' logits computed on the CPU.
//
//   hf_logits --model DIR --prompts "1,2,3;4,5" --steps 4 --out logits.safetensors
//             [--dtype float32] [--prefill_chunk 3] [--block_size 4] [--kv_cache_memory BYTES]
//             [--device cpu|cuda]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "checkpoint/safetensors.h"
#include "serving/llama.h"
#include "serving/models/hf_model.h"
#include "tools/cli_args.h"
#include "tools/llama_flags.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, prompts, "", "prompts: token ids, comma-separated; prompts ';'-separated");
ABSL_FLAG(int64_t, steps, 4, "greedy decode steps after the prefill");
ABSL_FLAG(std::string, out, "", "safetensors file rank 0 writes");
ABSL_FLAG(std::string, dtype, "", "weights' dtype (default: config.json's)");
ABSL_FLAG(int64_t, prefill_chunk, 512, "prefill chunk (tokens)");
ABSL_FLAG(int64_t, block_size, 16, "KV cache block size (positions)");
ABSL_FLAG(int64_t, kv_cache_memory, int64_t{16} << 20, "KV cache bytes per rank");

int main(int argc, char** argv) {
  namespace serving = dtensor::serving;
  dtensor::cli::parse_command_line(argc, argv,
                                   "hf_logits --model DIR --prompts 1,2;3 --steps N --out FILE");
  try {
    std::vector<std::vector<int64_t>> prompts;
    for (const auto& p : absl::StrSplit(absl::GetFlag(FLAGS_prompts), ';')) {
      prompts.push_back(dtensor::cli::parse_ints("--prompts", std::string(p)));
    }
    at::set_num_threads(1);
    // The launched processes as ranks (./x launch), else one process with plain tensors.
    const dtensor::tools::LaunchedRanks ranks =
        dtensor::tools::join_launched_ranks(dtensor::tools::device_type_from_flags());
    const int64_t rank = ranks.rank();
    const std::optional<dtensor::DeviceMesh>& mesh = ranks.mesh;
    serving::HfModelOptions o;
    if (!absl::GetFlag(FLAGS_dtype).empty()) {
      o.dtype = serving::dtype_from_name(absl::GetFlag(FLAGS_dtype));
    }
    o.device = ranks.device;
    o.max_batch = static_cast<int64_t>(prompts.size()) + 1;
    o.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
    o.block_size = absl::GetFlag(FLAGS_block_size);
    o.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_memory);
    const int64_t read_before = dtensor::checkpoint::tensor_bytes_read_by_this_thread();
    serving::HfModel model(absl::GetFlag(FLAGS_model), mesh, o);
    const int64_t weight_bytes_read =
        dtensor::checkpoint::tensor_bytes_read_by_this_thread() - read_before;

    // Fill some blocks with another sequence's keys, then free them for the prompts to reuse.
    const int scratch = model.alloc_slot();
    model.forward({{scratch, std::vector<int64_t>(2 * o.block_size + 1, 1), 0}});
    model.free_slot(scratch);

    std::vector<serving::Sequence> batch;
    for (const auto& p : prompts) batch.push_back({model.alloc_slot(), p, 0});
    const at::Tensor all = model.forward_all(batch);
    std::vector<std::pair<std::string, at::Tensor>> out;
    std::vector<std::vector<int64_t>> tokens(prompts.size());
    std::vector<std::vector<at::Tensor>> decode(prompts.size());
    int64_t row = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t n = static_cast<int64_t>(prompts[i].size());
      out.emplace_back("prefill." + std::to_string(i), all.narrow(0, row, n).contiguous());
      row += n;
      tokens[i].push_back(serving::greedy_token(all[row - 1]));
    }
    for (int64_t step = 0; step < absl::GetFlag(FLAGS_steps); ++step) {
      std::vector<serving::Sequence> next;
      for (size_t i = 0; i < prompts.size(); ++i) {
        next.push_back(
            {batch[i].slot, {tokens[i].back()}, static_cast<int64_t>(prompts[i].size()) + step});
      }
      const at::Tensor logits = model.forward(next);
      for (size_t i = 0; i < prompts.size(); ++i) {
        decode[i].push_back(logits[static_cast<int64_t>(i)]);
        tokens[i].push_back(serving::greedy_token(logits[static_cast<int64_t>(i)]));
      }
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (!decode[i].empty()) {
        out.emplace_back("decode." + std::to_string(i), at::stack(decode[i]).contiguous());
      }
      out.emplace_back("tokens." + std::to_string(i), at::tensor(tokens[i], at::kLong));
    }
    if (rank == 0) dtensor::checkpoint::write_safetensors(absl::GetFlag(FLAGS_out), out);
    // Every rank: the weight bytes it read from the files (its pieces only).
    std::ofstream(absl::GetFlag(FLAGS_out) + ".bytes_read." + std::to_string(rank))
        << weight_bytes_read << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "hf_logits: " << e.what() << "\n";
    return 1;
  }
}
