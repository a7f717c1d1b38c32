#pragma once
// POST /v1/completions as OpenAI defines it: the request's fields parsed and checked before
// anything reaches the ranks, and the response bodies (one JSON object, or server-sent-event
// chunks when "stream" is true). Pure functions: no server, no model.
//
// NOTE [completions fields]: accepted as OpenAI documents them: prompt (a string, or an array
// of token ids), max_tokens (default 16), temperature (0..2, default 1), top_p ((0, 1], default
// 1), stop (a string or up to 4 strings), stream, seed, model (any string; the response names
// this server's model), user, and the extensions vLLM and TGI accept: top_k (0 or -1: no
// limit). Fields of OpenAI's that change the result but are not implemented (n or best_of other
// than 1, echo, logprobs, suffix, logit_bias, nonzero penalties) are refused with 400 rather than
// ignored; fields nobody defines are ignored, as OpenAI does. A prompt and max_tokens must fit
// the context length together (vLLM's rule). Every error is 400 with OpenAI's error body
// {"error": {"message", "type": "invalid_request_error", "param", "code": null}}.
// Extension: each choice also carries "token_ids", the generated ids (the byte tokenizer's text
// is not always reversible; clients comparing generations use the ids).
//
// NOTE [chat completions]: POST /v1/chat/completions takes OpenAI's `messages` ({role: system,
// user or assistant; content: a string or text parts}) instead of `prompt`, and
// max_completion_tokens as max_tokens; the other fields are the completions' (logprobs false is
// accepted; tools and non-text response formats are refused). The messages are rendered with
// the model's chat template (serving/text/chat_template.h) and a generation prompt, encoded
// without added special tokens (the template holds bos), and generation stops at the family's
// end-of-turn tokens as stop strings besides the client's. Responses are "chat.completion"
// objects (message) or "chat.completion.chunk" events (delta; the first names the role).

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "serving/sampling.h"
#include "serving/tokenizer.h"

namespace dtensor::serving {

struct CompletionRequest {
  std::vector<int64_t> prompt;  // token ids
  int64_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool stream = false;
  bool chat = false;  // from /v1/chat/completions (NOTE [chat completions])
};

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the offending field, or empty
  std::string type = "invalid_request_error";
};

// The JSON error body of `e`.
std::string error_body(const ApiError& e);

// Parses and checks a request body against the tokenizer and the context length.
std::variant<CompletionRequest, ApiError> parse_completion_request(const std::string& body,
                                                                   const Tokenizer& tokenizer,
                                                                   int64_t context_length);

// Parses and checks a chat request (NOTE [chat completions]): the messages rendered through the
// tokenizer's chat template; 400 when the model has no supported template.
std::variant<CompletionRequest, ApiError> parse_chat_request(const std::string& body,
                                                             const Tokenizer& tokenizer,
                                                             int64_t context_length);

// Response bodies. `finish_reason` is "stop", "length", or empty while streaming.
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
std::string completion_body(const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::vector<int64_t>& token_ids,
                            const std::string& finish_reason, const Usage& usage);
// One server-sent event ("data: {...}\n\n") of a streamed completion; the last chunk carries the
// finish reason and the usage. The stream ends with stream_done().
std::string stream_chunk(const std::string& id, int64_t created, const std::string& model,
                         const std::string& text, const std::vector<int64_t>& token_ids,
                         const std::string& finish_reason, const std::optional<Usage>& usage);
std::string stream_done();
// The chat forms of the two (NOTE [chat completions]); `first`: the stream's first chunk.
std::string chat_completion_body(const std::string& id, int64_t created, const std::string& model,
                                 const std::string& text, const std::vector<int64_t>& token_ids,
                                 const std::string& finish_reason, const Usage& usage);
std::string chat_stream_chunk(const std::string& id, int64_t created, const std::string& model,
                              const std::string& text, const std::vector<int64_t>& token_ids,
                              const std::string& finish_reason, const std::optional<Usage>& usage,
                              bool first);

}  // namespace dtensor::serving
