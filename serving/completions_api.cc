#include "serving/completions_api.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "serving/text/chat_template.h"

namespace dtensor::serving {
namespace {

using nlohmann::json;

// Text for JSON: a token may end inside a UTF-8 sequence; invalid bytes become U+FFFD rather
// than failing the response.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError{400, message, param};
}

// The request's fields other than the prompt (NOTE [completions fields]), for completions and
// chat completions; `r.prompt` is set.
std::optional<ApiError> parse_fields(const json& j, bool chat, int64_t context_length,
                                     CompletionRequest& r) {
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  if (n >= context_length)
    return bad("prompt", "the prompt is " + std::to_string(n) + " tokens; the context length is " +
                             std::to_string(context_length) +
                             " (prompt plus at least one generated token)");

  // Chat: OpenAI's max_completion_tokens supersedes max_tokens.
  const char* max_key =
      chat && j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null()
          ? "max_completion_tokens"
          : "max_tokens";
  if (j.contains(max_key) && !j[max_key].is_null()) {
    const json& m = j[max_key];
    if (!m.is_number_integer()) return bad("max_tokens", "'max_tokens' must be an integer");
    if (m.is_number_unsigned() && m.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      return bad("max_tokens", "'max_tokens' is too large");
    r.max_tokens = m.get<int64_t>();
    if (r.max_tokens < 1) return bad("max_tokens", "'max_tokens' must be at least 1");
    if (r.max_tokens > context_length - n)
      return bad("max_tokens", "the prompt (" + std::to_string(n) + " tokens) plus max_tokens (" +
                                   std::to_string(r.max_tokens) + ") exceeds the context length (" +
                                   std::to_string(context_length) + ")");
  } else {
    r.max_tokens = std::min<int64_t>(16, context_length - n);
  }

  const auto number = [&](const char* key, double lo, double hi, bool lo_open, double& out,
                          std::optional<ApiError>& err) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number()) {
      err = bad(key, std::string("'") + key + "' must be a number");
      return;
    }
    const double v = j[key].get<double>();
    if (!std::isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo)) {
      err = bad(key, std::string("'") + key + "' must be in " + (lo_open ? "(" : "[") +
                         std::to_string(lo).substr(0, 3) + ", " + std::to_string(hi).substr(0, 3) +
                         "]");
      return;
    }
    out = v;
  };
  std::optional<ApiError> err;
  number("temperature", 0.0, 2.0, false, r.sampling.temperature, err);
  if (err) return *err;
  number("top_p", 0.0, 1.0, true, r.sampling.top_p, err);
  if (err) return *err;
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    if (!j["top_k"].is_number_integer() || j["top_k"].get<int64_t>() < -1)
      return bad("top_k", "'top_k' must be an integer: -1 or 0 (no limit), or at least 1");
    r.sampling.top_k = std::max<int64_t>(0, j["top_k"].get<int64_t>());
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (!j["seed"].is_number_integer()) return bad("seed", "'seed' must be an integer");
    r.sampling.seed = j["seed"].is_number_unsigned()
                          ? j["seed"].get<uint64_t>()
                          : static_cast<uint64_t>(j["seed"].get<int64_t>());
  }
  if (j.contains("stop") && !j["stop"].is_null()) {
    const json& s = j["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const auto& x : s) {
        if (!x.is_string()) return bad("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or an array of at most 4 strings");
    }
    for (const auto& x : r.stop)
      if (x.empty()) return bad("stop", "'stop' strings must not be empty");
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return bad("stream", "'stream' must be a boolean");
    r.stream = j["stream"].get<bool>();
  }
  if (j.contains("model") && !j["model"].is_null() && !j["model"].is_string())
    return bad("model", "'model' must be a string");
  if (j.contains("user") && !j["user"].is_null() && !j["user"].is_string())
    return bad("user", "'user' must be a string");

  // OpenAI fields that would change the result but are not implemented: refused, not ignored.
  for (const char* key : {"n", "best_of"})
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_number_integer() && j[key] == 1))
      return bad(key, std::string("'") + key + "' other than 1 is not supported");
  if (j.contains("echo") && !j["echo"].is_null() && j["echo"] != false)
    return bad("echo", "'echo' is not supported");
  for (const char* key : {"logprobs", "suffix", "top_logprobs"})
    if (j.contains(key) && !j[key].is_null() && !(chat && j[key] == false))
      return bad(key, std::string("'") + key + "' is not supported");
  for (const char* key : {"tools", "functions", "tool_choice", "function_call"})
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_array() && j[key].empty()) &&
        j[key] != "none")
      return bad(key, std::string("'") + key + "' is not supported (no tool calls)");
  if (j.contains("response_format") && !j["response_format"].is_null() &&
      j["response_format"] != json{{"type", "text"}})
    return bad("response_format", "only a 'response_format' of type 'text' is supported");
  if (j.contains("logit_bias") && !j["logit_bias"].is_null() &&
      !(j["logit_bias"].is_object() && j["logit_bias"].empty()))
    return bad("logit_bias", "'logit_bias' is not supported");
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_number() && j[key].get<double>() == 0))
      return bad(key, std::string("'") + key + "' other than 0 is not supported");
  return std::nullopt;
}

}  // namespace

std::string error_body(const ApiError& e) {
  return dump({{"error",
                {{"message", e.message},
                 {"type", e.type},
                 {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                 {"code", nullptr}}}});
}

std::variant<CompletionRequest, ApiError> parse_completion_request(const std::string& body,
                                                                   const Tokenizer& tokenizer,
                                                                   int64_t context_length) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("", "the request body is not valid JSON");
  if (!j.is_object()) return bad("", "the request body must be a JSON object");
  CompletionRequest r;

  // prompt: a string, or an array of token ids (OpenAI's forms for one prompt).
  if (!j.contains("prompt")) return bad("prompt", "'prompt' is required");
  const json& p = j["prompt"];
  if (p.is_string()) {
    r.prompt = tokenizer.encode(p.get<std::string>());
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    for (const auto& t : p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() >= tokenizer.vocab_size())
        return bad("prompt", "'prompt' token ids must be integers in [0, " +
                                 std::to_string(tokenizer.vocab_size()) + ")");
      r.prompt.push_back(t.get<int64_t>());
    }
  } else if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
    return bad("prompt", "a batch of prompts is not supported: send one request per prompt");
  } else {
    return bad("prompt", "'prompt' must be a string or an array of token ids");
  }
  if (r.prompt.empty()) return bad("prompt", "'prompt' is empty");
  if (auto e = parse_fields(j, /*chat=*/false, context_length, r)) return *e;
  return r;
}

std::variant<CompletionRequest, ApiError> parse_chat_request(const std::string& body,
                                                             const Tokenizer& tokenizer,
                                                             int64_t context_length) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("", "the request body is not valid JSON");
  if (!j.is_object()) return bad("", "the request body must be a JSON object");
  const ChatTemplate* chat = tokenizer.chat_template();
  if (!chat) return bad("messages", "this model has no chat template: use /v1/completions");
  if (!chat->supported()) return bad("messages", chat->error());
  if (!j.contains("messages") || !j["messages"].is_array() || j["messages"].empty())
    return bad("messages", "'messages' must be a non-empty array of {role, content}");
  std::vector<ChatMessage> messages;
  for (const json& m : j["messages"]) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return bad("messages", "each message needs a string 'role'");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant")
      return bad("messages",
                 "message role '" + role + "' is not supported (system, user, assistant)");
    // content: a string, or OpenAI's array of parts of which only text parts are supported.
    std::string content;
    const json& c = m.value("content", json());
    if (c.is_string()) {
      content = c.get<std::string>();
    } else if (c.is_array()) {
      for (const json& part : c) {
        if (!part.is_object() || part.value("type", std::string()) != "text" ||
            !part.contains("text") || !part["text"].is_string())
          return bad("messages", "only text content parts are supported");
        content += part["text"].get<std::string>();
      }
    } else {
      return bad("messages", "message 'content' must be a string or an array of text parts");
    }
    messages.push_back({role, std::move(content)});
  }
  CompletionRequest r;
  r.chat = true;
  try {
    r.prompt = tokenizer.encode(chat->render(messages, /*add_generation_prompt=*/true),
                                /*add_special_tokens=*/false);
  } catch (const std::exception& e) {
    return bad("messages", e.what());
  }
  if (r.prompt.empty()) return bad("messages", "the rendered prompt is empty");
  if (auto e = parse_fields(j, /*chat=*/true, context_length, r)) return *e;
  // Generation ends at the family's end-of-turn tokens (their text; the client's stop strings
  // were checked above, so these do not count against its four).
  for (const std::string& s : chat->stop_strings()) r.stop.push_back(s);
  return r;
}

namespace {

// A completion object (the response, or one streamed chunk): one choice, and usage when given.
json completion_json(const std::string& id, int64_t created, const std::string& model,
                     const std::string& text, const std::vector<int64_t>& token_ids,
                     const std::string& finish_reason, const std::optional<Usage>& usage) {
  json j = {{"id", id},
            {"object", "text_completion"},
            {"created", created},
            {"model", model},
            {"choices",
             {{{"index", 0},
               {"text", text},
               {"token_ids", token_ids},
               {"logprobs", nullptr},
               {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}}}}};
  if (usage)
    j["usage"] = {{"prompt_tokens", usage->prompt_tokens},
                  {"completion_tokens", usage->completion_tokens},
                  {"total_tokens", usage->prompt_tokens + usage->completion_tokens}};
  return j;
}

// A chat completion object, or one streamed chunk ("delta" instead of "message"; the first
// chunk names the role).
json chat_json(const std::string& id, int64_t created, const std::string& model,
               const std::string& text, const std::vector<int64_t>& token_ids,
               const std::string& finish_reason, const std::optional<Usage>& usage, bool stream,
               bool first) {
  json message = {{"content", text}};
  if (!stream || first) message["role"] = "assistant";
  json j = {{"id", id},
            {"object", stream ? "chat.completion.chunk" : "chat.completion"},
            {"created", created},
            {"model", model},
            {"choices",
             {{{"index", 0},
               {stream ? "delta" : "message", message},
               {"token_ids", token_ids},
               {"logprobs", nullptr},
               {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}}}}};
  if (usage)
    j["usage"] = {{"prompt_tokens", usage->prompt_tokens},
                  {"completion_tokens", usage->completion_tokens},
                  {"total_tokens", usage->prompt_tokens + usage->completion_tokens}};
  return j;
}

}  // namespace

std::string completion_body(const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::vector<int64_t>& token_ids,
                            const std::string& finish_reason, const Usage& usage) {
  return dump(completion_json(id, created, model, text, token_ids, finish_reason, usage));
}

std::string stream_chunk(const std::string& id, int64_t created, const std::string& model,
                         const std::string& text, const std::vector<int64_t>& token_ids,
                         const std::string& finish_reason, const std::optional<Usage>& usage) {
  return "data: " +
         dump(completion_json(id, created, model, text, token_ids, finish_reason, usage)) + "\n\n";
}

std::string chat_completion_body(const std::string& id, int64_t created, const std::string& model,
                                 const std::string& text, const std::vector<int64_t>& token_ids,
                                 const std::string& finish_reason, const Usage& usage) {
  return dump(chat_json(id, created, model, text, token_ids, finish_reason, usage, false, false));
}

std::string chat_stream_chunk(const std::string& id, int64_t created, const std::string& model,
                              const std::string& text, const std::vector<int64_t>& token_ids,
                              const std::string& finish_reason, const std::optional<Usage>& usage,
                              bool first) {
  return "data: " +
         dump(chat_json(id, created, model, text, token_ids, finish_reason, usage, true, first)) +
         "\n\n";
}

std::string stream_done() { return "data: [DONE]\n\n"; }

}  // namespace dtensor::serving
