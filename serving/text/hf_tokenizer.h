#pragma once
// Hugging Face tokenizers from tokenizer.json (with tokenizer_config.json beside it for the
// bos/eos tokens and the chat template), for the families the server serves: byte-level BPE
// (GPT-2, Llama 3, Qwen2) and SentencePiece-style BPE with byte fallback (Llama 2, Mistral).
//
// NOTE [hf tokenizer pipeline]: encode follows the reference (the `tokenizers` package):
//   1. added tokens that are not `normalized` (special tokens among them) are cut out of the raw
//      text, leftmost-longest, honouring single_word/lstrip/rstrip;
//   2. each remaining segment is normalized (Sequence, Prepend, Replace, NFC), and `normalized`
//      added tokens are cut out of the normalized text;
//   3. each remaining piece is pre-tokenized (Sequence, Split, ByteLevel, Metaspace, Digits)
//      into words, and the BPE model (bpe.h) maps each word to ids;
//   4. with add_special_tokens, the post-processor (TemplateProcessing) adds bos/eos ids.
// decode maps ids to tokens; added tokens are emitted verbatim and the decoder (ByteLevel,
// Sequence, Replace, ByteFallback, Fuse, Strip, Metaspace) runs on each run of model tokens
// between them. Any field or value outside this is refused at load, naming it.

#include <memory>
#include <string>

#include "serving/tokenizer.h"

namespace dtensor::serving {

// `path`: a model directory (tokenizer.json, and tokenizer_config.json and chat_template.jinja
// when present) or a tokenizer.json file. Throws dtensor::Error naming what is unsupported.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

}  // namespace dtensor::serving
