#pragma once
// Chat templates (tokenizer_config.json's "chat_template", or chat_template.jinja) rendered by
// per-family code rather than a Jinja engine.
//
// NOTE [chat template families]: the template's text selects the family by the markers its
// official templates contain, and per-family code produces the text the template would
// (hf_text_test.py compares it with transformers' apply_chat_template on templates in each
// family's format):
//   ChatML (Qwen2, Qwen2.5)  "<|im_start|>" without "<think>"; a default system message is
//                            taken from the template's '<|im_start|>system\n...<|im_end|>' literal
//   Qwen3                    "<|im_start|>" and "<think>": earlier assistant turns lose their
//                            <think> blocks; the turn after the last user query keeps them
//   Llama 3                  "<|start_header_id|>"
//   Llama 3.1/3.2            and "Cutting Knowledge Date": a system turn always, with the
//                            template's knowledge and today dates (3.2's strftime_now: today)
//   Llama 2                  "[INST]" and "<<SYS>>": the system message joins the first turn
//   Mistral                  "[INST]" without "<<SYS>>": no system role
// Messages are {role, content} with string content; tools are not supported. A template that
// matches no family is refused with an error naming the families; the model still serves
// /v1/completions.

#include <string>
#include <vector>

namespace dtensor::serving {

struct ChatMessage {
  std::string role, content;
};

class ChatTemplate {
 public:
  enum class Family { kUnsupported, kChatML, kQwen3, kLlama3, kLlama31, kLlama2, kMistral };

  // The family of template `source` (NOTE [chat template families]); `bos`/`eos`: the
  // tokenizer's bos_token and eos_token texts (empty when it has none).
  static ChatTemplate recognize(const std::string& source, const std::string& bos,
                                const std::string& eos);

  Family family() const { return family_; }
  const char* family_name() const;
  bool supported() const { return family_ != Family::kUnsupported; }
  // Why the template is not supported.
  const std::string& error() const { return error_; }

  // The prompt text of `messages`, as apply_chat_template(messages, tokenize=False,
  // add_generation_prompt=...) gives it. Throws dtensor::Error for a conversation the template
  // refuses (roles that do not alternate, a role it does not know) or when unsupported.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  // The texts of the family's end-of-turn tokens (and eos): generation stops at them.
  const std::vector<std::string>& stop_strings() const { return stops_; }

 private:
  Family family_ = Family::kUnsupported;
  std::string error_;
  std::string bos_, eos_;
  std::string default_system_;  // ChatML: the system message used when none is given
  bool has_default_system_ = false;
  std::string knowledge_date_, today_date_;  // Llama 3.1; today_date_ empty: strftime_now
  std::vector<std::string> stops_;
};

}  // namespace dtensor::serving
