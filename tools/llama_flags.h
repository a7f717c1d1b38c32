#pragma once
// The model-size flags every tool that builds the serving Llama takes (--vocab --dim --heads
// --hidden, the demo's sizes by default): ./x serve (serve.cc) and llama_generate.

#include <cstdint>

#include "serving/llama.h"

namespace dtensor::tools {

// LlamaConfig from the flags, with `max_seq` positions of KV cache per slot.
serving::LlamaConfig llama_config_from_flags(int64_t max_seq);

}  // namespace dtensor::tools
