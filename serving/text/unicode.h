#pragma once
// UTF-8 and the Unicode properties the tokenizers need: \p{L}, \p{N}, \s (White_Space, as the
// Oniguruma regex engine of Hugging Face's tokenizers reads it) and NFC.

#include <string>

namespace dtensor::serving::text {

// Code points of valid UTF-8 `s` (invalid input throws, naming the byte offset).
std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
void utf8_append(std::string& out, char32_t cp);
// The length of the longest prefix of `s` that ends on a complete UTF-8 sequence: a trailing
// sequence that valid bytes could still complete is left out, anything else is counted.
size_t utf8_complete_prefix(const std::string& s);

bool is_letter(char32_t c);
bool is_number(char32_t c);
bool is_whitespace(char32_t c);
// Regex \w in Unicode (the Rust regex crate's): letters, marks, decimal digits, connectors.
bool is_word_char(char32_t c);

// Unicode normalization form C (canonical decomposition, canonical order, canonical composition).
std::u32string nfc(const std::u32string& s);

}  // namespace dtensor::serving::text
