// Runs a Hugging Face tokenizer (hf_tokenizer.h) on requests read as one JSON object from stdin,
// and prints the results as one JSON object: the C++ side of hf_text_test.py.
//
//   tokenizer_tool PATH < {"encode": [{"text": s, "add_special_tokens": b}, ...],
//                          "decode": [[ids], ...], "stream": [[ids], ...],
//                          "chat": [{"messages": [{"role", "content"}], "add_generation_prompt":
//                          b}]}
//   -> {"encode": [[ids]], "decode": [text], "stream": [[piece per id..., final piece]],
//       "chat": [text or {"error": message}], "vocab_size", "bos_id", "eos_id",
//       "chat_family", "chat_stops"}

#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "serving/text/chat_template.h"
#include "serving/text/hf_tokenizer.h"

int main(int argc, char** argv) {
  using nlohmann::json;
  using namespace dtensor::serving;
  if (argc != 2) {
    std::cerr << "usage: tokenizer_tool TOKENIZER_DIR_OR_JSON < requests.json\n";
    return 2;
  }
  try {
    const std::unique_ptr<Tokenizer> tok = load_hf_tokenizer(argv[1]);
    const std::string input((std::istreambuf_iterator<char>(std::cin)),
                            std::istreambuf_iterator<char>());
    const json req = json::parse(input);
    json out = json::object();
    out["vocab_size"] = tok->vocab_size();
    out["bos_id"] = tok->bos_id() ? json(*tok->bos_id()) : json(nullptr);
    out["eos_id"] = tok->eos_id() ? json(*tok->eos_id()) : json(nullptr);
    if (const ChatTemplate* t = tok->chat_template()) {
      out["chat_family"] = t->family_name();
      out["chat_stops"] = t->stop_strings();
    }
    for (const json& e : req.value("encode", json::array()))
      out["encode"].push_back(
          tok->encode(e.at("text").get<std::string>(), e.value("add_special_tokens", true)));
    for (const json& ids : req.value("decode", json::array()))
      out["decode"].push_back(tok->decode(ids.get<std::vector<int64_t>>()));
    for (const json& ids : req.value("stream", json::array())) {
      StreamDecoder d(*tok);
      json pieces = json::array();
      for (int64_t id : ids.get<std::vector<int64_t>>()) pieces.push_back(d.push(id));
      pieces.push_back(d.finish());
      out["stream"].push_back(pieces);
    }
    for (const json& c : req.value("chat", json::array())) {
      std::vector<ChatMessage> messages;
      for (const json& m : c.at("messages"))
        messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
      try {
        DTENSOR_CHECK(tok->chat_template(), "the tokenizer has no chat template");
        out["chat"].push_back(
            tok->chat_template()->render(messages, c.value("add_generation_prompt", false)));
      } catch (const std::exception& e) {
        out["chat"].push_back({{"error", e.what()}});
      }
    }
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  } catch (const std::exception& e) {
    std::cout << json{{"load_error", e.what()}}.dump(-1, ' ', false, json::error_handler_t::replace)
              << "\n";
    return 1;
  }
  return 0;
}
