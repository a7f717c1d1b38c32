// /v1/chat/completions' request parsing and response bodies (NOTE [chat completions]) on a model
// directory with a ChatML template: the prompt is the template's rendering encoded without added
// special tokens, generation stops at <|im_end|>, and what the endpoint refuses it refuses with
// OpenAI's 400. (The rendering itself is checked against transformers in hf_text_test.py.)

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>

#include "serving/completions_api.h"
#include "serving/text/chat_template.h"
#include "serving/text/hf_tokenizer.h"

namespace dtensor::serving {
namespace {

using nlohmann::json;

// A byte-level tokenizer.json with every byte as a token and ChatML's special tokens.
std::string byte_level_tokenizer() {
  json vocab = json::object();
  // GPT-2's byte alphabet: printable bytes are themselves, the others U+0100 onward.
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t c = printable ? b : 256 + next++;
    std::string s;
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else {
      s.push_back(static_cast<char>(0xC0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    vocab[s] = b;
  }
  json added = json::array();
  int id = 256;
  for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"})
    added.push_back({{"id", id++},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  return json{
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"ignore_merges", false}}}}
      .dump();
}

class ChatApi : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/chat_api_model";
    mkdir(dir_.c_str(), 0755);
    std::ofstream(dir_ + "/tokenizer.json") << byte_level_tokenizer();
    const std::string tmpl =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}";
    std::ofstream(dir_ + "/tokenizer_config.json")
        << json{{"eos_token", "<|im_end|>"}, {"chat_template", tmpl}}.dump();
    tok_ = load_hf_tokenizer(dir_);
  }
  std::variant<CompletionRequest, ApiError> parse(const json& body) {
    return parse_chat_request(body.dump(), *tok_, 4096);
  }
  std::string dir_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(ChatApi, PromptIsTheRenderedTemplate) {
  const json messages = {
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "user"},
       {"content", {{{"type", "text"}, {"text", "Hi "}}, {{"type", "text"}, {"text", "😀"}}}}}};
  auto parsed = parse(
      {{"messages", messages}, {"max_completion_tokens", 7}, {"stop", "END"}, {"logprobs", false}});
  ASSERT_TRUE(std::holds_alternative<CompletionRequest>(parsed))
      << std::get<ApiError>(parsed).message;
  const CompletionRequest& r = std::get<CompletionRequest>(parsed);
  ASSERT_NE(tok_->chat_template(), nullptr);
  const std::string text = tok_->chat_template()->render(
      {{"system", "Be brief."}, {"user", "Hi 😀"}}, /*add_generation_prompt=*/true);
  EXPECT_EQ(text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 😀<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(r.prompt, tok_->encode(text, /*add_special_tokens=*/false));
  EXPECT_EQ(r.prompt.front(), *tok_->token_id("<|im_start|>"));
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"END", "<|im_end|>"}));
}

TEST_F(ChatApi, RefusedRequests) {
  const json user = {{{"role", "user"}, {"content", "hi"}}};
  const auto refused = [&](const json& body, const std::string& param) {
    auto parsed = parse(body);
    ASSERT_TRUE(std::holds_alternative<ApiError>(parsed)) << body.dump();
    EXPECT_EQ(std::get<ApiError>(parsed).status, 400);
    EXPECT_EQ(std::get<ApiError>(parsed).param, param) << std::get<ApiError>(parsed).message;
  };
  refused(json::object(), "messages");
  refused({{"messages", json::array()}}, "messages");
  refused({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}, "messages");
  refused({{"messages", {{{"role", "user"}, {"content", 3}}}}}, "messages");
  refused({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}, "messages");
  refused({{"messages", user}, {"tools", {{{"type", "function"}}}}}, "tools");
  refused({{"messages", user}, {"logprobs", true}}, "logprobs");
  refused({{"messages", user}, {"response_format", {{"type", "json_object"}}}}, "response_format");
  refused({{"messages", user}, {"max_tokens", 0}}, "max_tokens");
  // A model without a chat template.
  ByteTokenizer bytes(512);
  auto parsed = parse_chat_request(json{{"messages", user}}.dump(), bytes, 4096);
  ASSERT_TRUE(std::holds_alternative<ApiError>(parsed));
  EXPECT_NE(std::get<ApiError>(parsed).message.find("no chat template"), std::string::npos);
}

TEST_F(ChatApi, ResponseBodies) {
  const json body =
      json::parse(chat_completion_body("c1", 5, "m", "Hello", {1, 2}, "stop", {3, 2}));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"], (json{{"role", "assistant"}, {"content", "Hello"}}));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["total_tokens"], 5);
  const std::string first = chat_stream_chunk("c1", 5, "m", "He", {1}, "", std::nullopt, true);
  const std::string later = chat_stream_chunk("c1", 5, "m", "llo", {2}, "stop", Usage{3, 2}, false);
  ASSERT_EQ(first.rfind("data: ", 0), 0u);
  const json a = json::parse(first.substr(6)), b = json::parse(later.substr(6));
  EXPECT_EQ(a["object"], "chat.completion.chunk");
  EXPECT_EQ(a["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", "He"}}));
  EXPECT_EQ(b["choices"][0]["delta"], (json{{"content", "llo"}}));
  EXPECT_EQ(b["choices"][0]["finish_reason"], "stop");
}

}  // namespace
}  // namespace dtensor::serving
