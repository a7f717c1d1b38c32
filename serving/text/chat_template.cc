#include "serving/text/chat_template.h"

#include <algorithm>
#include <ctime>

#include "base/error.h"
#include "serving/text/unicode.h"

namespace dtensor::serving {
namespace {

using text::utf8_decode;
using text::utf8_encode;

// Python's str.isspace(), which Jinja's trim filter (str.strip) uses: White_Space and the
// separators U+001C..U+001F.
bool py_space(char32_t c) { return text::is_whitespace(c) || (c >= 0x1C && c <= 0x1F); }

std::string py_strip(const std::string& s) {
  const std::u32string u = utf8_decode(s);
  size_t b = 0, e = u.size();
  while (b < e && py_space(u[b])) ++b;
  while (e > b && py_space(u[e - 1])) --e;
  return utf8_encode(u.substr(b, e - b));
}

// str.lstrip(c) / str.rstrip(c) for one ASCII character.
std::string lstrip_char(const std::string& s, char c) {
  const size_t b = s.find_first_not_of(c);
  return b == std::string::npos ? std::string() : s.substr(b);
}
std::string rstrip_char(const std::string& s, char c) {
  const size_t e = s.find_last_not_of(c);
  return e == std::string::npos ? std::string() : s.substr(0, e + 1);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A Jinja string literal's text with its escapes (\n, \', \", \\) resolved.
std::string jinja_unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// The ChatML default system message: the text of a '<|im_start|>system\n...<|im_end|>' string
// literal in the template, or false when it has none.
bool default_system(const std::string& source, std::string& out) {
  for (size_t at = source.find("<|im_start|>system"); at != std::string::npos;
       at = source.find("<|im_start|>system", at + 1)) {
    size_t b = at + std::string("<|im_start|>system").size();
    if (source.compare(b, 2, "\\n") == 0) {
      b += 2;
    } else if (source.compare(b, 1, "\n") == 0) {
      b += 1;
    } else {
      continue;
    }
    const size_t e = source.find("<|im_end|>", b);
    if (e == std::string::npos) continue;
    const std::string body = source.substr(b, e - b);
    if (body.empty() || body.find_first_of("'\"{}+") != std::string::npos) continue;
    out = jinja_unescape(body);
    return true;
  }
  return false;
}

// The text in `source` between `start` and the next `end`, if any.
bool literal_after(const std::string& source, const std::string& start, const std::string& end,
                   std::string& out) {
  const size_t b = source.find(start);
  if (b == std::string::npos) return false;
  const size_t e = source.find(end, b + start.size());
  if (e == std::string::npos) return false;
  out = source.substr(b + start.size(), e - b - start.size());
  return true;
}

// Today as transformers' strftime_now("%d %b %Y") gives it (local time).
std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%d %b %Y", &tm);
  return buf;
}

void check_alternation(const std::vector<ChatMessage>& messages, size_t first) {
  for (size_t i = first; i < messages.size(); ++i) {
    DTENSOR_CHECK((messages[i].role == "user") == ((i - first) % 2 == 0),
                  "chat template: conversation roles must alternate "
                  "user/assistant/user/assistant/...");
  }
}

std::string render_qwen3(const std::vector<ChatMessage>& m, bool add_generation_prompt) {
  std::string out;
  if (!m.empty() && m[0].role == "system")
    out += "<|im_start|>system\n" + m[0].content + "<|im_end|>\n";
  // The last user query that is not a tool response.
  size_t last_query = m.empty() ? 0 : m.size() - 1;
  for (size_t k = m.size(); k-- > 0;) {
    const std::string& c = m[k].content;
    const bool tool_response = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 &&
                               c.compare(c.size() - 16, 16, "</tool_response>") == 0;
    if (m[k].role == "user" && !tool_response) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    std::string content = msg.content;
    if (msg.role == "user" || (msg.role == "system" && i != 0)) {
      out += "<|im_start|>" + msg.role + "\n" + content + "<|im_end|>\n";
    } else if (msg.role == "assistant") {
      std::string reasoning;
      const size_t close = content.find("</think>");
      if (close != std::string::npos) {
        std::string before = rstrip_char(content.substr(0, close), '\n');
        const size_t open = before.rfind("<think>");
        if (open != std::string::npos) before = before.substr(open + 7);
        reasoning = lstrip_char(before, '\n');
        content = lstrip_char(content.substr(content.rfind("</think>") + 8), '\n');
      }
      if (i > last_query && (i + 1 == m.size() || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" +
               rstrip_char(lstrip_char(reasoning, '\n'), '\n') + "\n</think>\n\n" +
               lstrip_char(content, '\n');
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      out += "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace

ChatTemplate ChatTemplate::recognize(const std::string& source, const std::string& bos,
                                     const std::string& eos) {
  ChatTemplate t;
  t.bos_ = bos;
  t.eos_ = eos;
  std::string end_of_turn;
  if (contains(source, "<|im_start|>")) {
    t.family_ = contains(source, "<think>") ? Family::kQwen3 : Family::kChatML;
    if (t.family_ == Family::kChatML)
      t.has_default_system_ = default_system(source, t.default_system_);
    end_of_turn = "<|im_end|>";
  } else if (contains(source, "<|start_header_id|>")) {
    t.family_ = Family::kLlama3;
    if (contains(source, "Cutting Knowledge Date: ")) {
      t.family_ = Family::kLlama31;
      // The date ends at the string's newline, written as the escape \n or as a newline.
      const std::string kKnowledge = "Cutting Knowledge Date: ";
      const std::string rest = source.substr(source.find(kKnowledge) + kKnowledge.size(), 64);
      t.knowledge_date_ = rest.substr(0, std::min(rest.find("\\n"), rest.find('\n')));
      if (t.knowledge_date_.empty() ||
          (!contains(source, "strftime_now") &&
           !literal_after(source, "set date_string = \"", "\"", t.today_date_))) {
        t.family_ = Family::kUnsupported;
        t.error_ = "the Llama 3.1 chat template's dates could not be read";
        return t;
      }
    }
    end_of_turn = "<|eot_id|>";
  } else if (contains(source, "[INST]")) {
    t.family_ = contains(source, "<<SYS>>") ? Family::kLlama2 : Family::kMistral;
  } else {
    t.error_ =
        "the model's chat template is not one this server renders (NOTE [chat template "
        "families]: ChatML/Qwen2, Qwen3, Llama 3, Llama 3.1, Llama 2, Mistral); use "
        "/v1/completions with a rendered prompt";
    return t;
  }
  if (!end_of_turn.empty()) t.stops_.push_back(end_of_turn);
  if (!eos.empty() && eos != end_of_turn) t.stops_.push_back(eos);
  return t;
}

const char* ChatTemplate::family_name() const {
  switch (family_) {
    case Family::kChatML:
      return "chatml";
    case Family::kQwen3:
      return "qwen3";
    case Family::kLlama3:
      return "llama3";
    case Family::kLlama31:
      return "llama3.1";
    case Family::kLlama2:
      return "llama2";
    case Family::kMistral:
      return "mistral";
    case Family::kUnsupported:
      break;
  }
  return "unsupported";
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& m,
                                 bool add_generation_prompt) const {
  // NOTE [chat template families].
  std::string out;
  switch (family_) {
    case Family::kUnsupported:
      fail(error_);
    case Family::kChatML:
      for (size_t i = 0; i < m.size(); ++i) {
        if (i == 0 && m[0].role != "system" && has_default_system_)
          out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
        out += "<|im_start|>" + m[i].role + "\n" + m[i].content + "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case Family::kQwen3:
      return render_qwen3(m, add_generation_prompt);
    case Family::kLlama31: {
      // A system turn always: the dates, then the (trimmed) system message if given.
      const bool system = !m.empty() && m[0].role == "system";
      out = bos_ + "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: " +
            knowledge_date_ + "\nToday Date: " + (today_date_.empty() ? today() : today_date_) +
            "\n\n" + (system ? py_strip(m[0].content) : std::string()) + "<|eot_id|>";
      for (size_t i = system ? 1 : 0; i < m.size(); ++i)
        out += "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n" +
               py_strip(m[i].content) + "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    }
    case Family::kLlama3:
      for (size_t i = 0; i < m.size(); ++i) {
        if (i == 0) out += bos_;
        out += "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n" +
               py_strip(m[i].content) + "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case Family::kLlama2: {
      const bool system = !m.empty() && m[0].role == "system";
      const size_t first = system ? 1 : 0;
      check_alternation(m, first);
      for (size_t i = first; i < m.size(); ++i) {
        std::string content = m[i].content;
        if (i == first && system) content = "<<SYS>>\n" + m[0].content + "\n<</SYS>>\n\n" + content;
        if (m[i].role == "user") {
          out += bos_ + "[INST] " + py_strip(content) + " [/INST]";
        } else if (m[i].role == "assistant") {
          out += " " + py_strip(content) + " " + eos_;
        }
      }
      return out;
    }
    case Family::kMistral:
      check_alternation(m, 0);
      out = bos_;
      for (const ChatMessage& msg : m) {
        if (msg.role == "user") {
          out += "[INST] " + msg.content + " [/INST]";
        } else if (msg.role == "assistant") {
          out += msg.content + eos_;
        } else {
          fail("chat template: only user and assistant roles are supported");
        }
      }
      return out;
  }
  return out;
}

}  // namespace dtensor::serving
