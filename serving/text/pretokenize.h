#pragma once
// The splitting steps of Hugging Face's pre-tokenizers: the regex families of the Split
// pre-tokenizer (matched by hand: NOTE [split patterns]), split behaviours, and the byte-level
// alphabet.
//
// NOTE [split patterns]: std::regex has no \p{L}/\p{N} and no lookahead, so the Split patterns
// that byte-level tokenizers use are recognized by their exact text and matched by code: GPT-2's
// (also ByteLevel's use_regex), Llama 3's and Qwen2's. Each is an alternation tried in order at
// each position (leftmost-first, as the reference's regex engine does); the alternatives are:
//   contractions  's|'t|'re|'ve|'m|'ll|'d, case-insensitive in Llama 3 and Qwen2
//   letters       GPT-2: ` ?\p{L}+`; Llama 3/Qwen2: `[^\r\n\p{L}\p{N}]?\p{L}+`
//   numbers       GPT-2: ` ?\p{N}+`; Llama 3: `\p{N}{1,3}`; Qwen2: `\p{N}`
//   other         ` ?[^\s\p{L}\p{N}]+`, then `[\r\n]*` in Llama 3/Qwen2
//   newlines      `\s*[\r\n]+` (Llama 3/Qwen2): whitespace up to and including the run's last
//                 newline (the greedy \s* gives back to the last [\r\n])
//   spaces        `\s+(?!\S)`: a whitespace run, less its last character when a non-space
//                 follows (so that character can prefix the next word); then `\s+`.
// \s is Unicode White_Space; \p{L}/\p{N} the general categories (unicode_tables.cc).

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtensor::serving::text {

enum class SplitPattern { kGpt2, kLlama3, kQwen2 };

// The family of a Split regex, or nullopt when the text is not one of them.
std::optional<SplitPattern> recognize_split_pattern(const std::string& regex);

using Span = std::pair<size_t, size_t>;  // [begin, end) in code points

// Non-overlapping matches of `pattern` in `s`, in order.
std::vector<Span> find_pattern_matches(SplitPattern pattern, const std::u32string& s);
// Non-overlapping matches of a literal string.
std::vector<Span> find_literal_matches(const std::u32string& literal, const std::u32string& s);

// The reference's SplitDelimiterBehavior.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
std::optional<SplitBehavior> parse_split_behavior(const std::string& name);

// The pieces of a string of length `n` that `matches` cut it into under `behavior` (`invert`:
// the gaps are the delimiters). Empty pieces are dropped.
std::vector<Span> split_spans(size_t n, const std::vector<Span>& matches, SplitBehavior behavior,
                              bool invert);

// GPT-2's byte-to-character alphabet: printable bytes stand for themselves, the rest for
// U+0100 onward.
char32_t byte_to_char(unsigned char b);
// The byte a byte-level character stands for, or -1.
int char_to_byte(char32_t c);

}  // namespace dtensor::serving::text
