// `strata data prepare --jsonl`: conversations to a Megatron dataset and its loss mask
// (data/loss_mask.h), for instruction fine-tuning on the assistant's turns.
//
// Input: JSON Lines, one conversation a line, as the OpenAI and Hugging Face formats write them:
//   {"messages": [{"role": "system"|"user"|"assistant"|..., "content": ..., ...}, ...]}
//   {"prompt": ..., "completion": ...}: strings are a user turn and an assistant turn; lists of
//   messages are the conversation's beginning and its end.
// Every message is handed to the template whole (reasoning_content, tool_calls, ... included).
//
// Each conversation is rendered with the model's chat template (data/jinja.h) as
// transformers' apply_chat_template(messages, tokenize=False) renders it, with the tokenizer's
// special tokens (bos_token, eos_token, ... of tokenizer_config.json), tools and documents none,
// and tokenized as one text (added tokens matched, no template around it: the chat template
// writes its own BOS). The template: --chat-template FILE, else chat_template.jinja beside the
// tokenizer, else tokenizer_config.json's chat_template.
//
// Trained tokens (train_on "assistant"): the text of each assistant turn, from its first
// character after the template's generation prompt through its end-of-turn marker, as
//   - the template's {% generation %} blocks say, when it has them (transformers'
//     return_assistant_tokens_mask); else
//   - the difference between the conversation rendered up to that turn with
//     add_generation_prompt and rendered through it (the turn as the model must write it),
//     found in the whole rendering: at the same place when the template renders earlier turns as
//     it renders the last, else, in order, the longest end of it that holds the message's content
//     and follows the same character as there (the end of the turn's header; Qwen3 drops the
//     reasoning of earlier turns, Mistral moves the system prompt). A turn found nowhere is an
//     error.
// A token that straddles a boundary of a trained span goes with the text after the boundary.
// train_on "all": every token. Each conversation is one document; the last val_fraction of them
// (at least one when > 0) is the validation split.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace strata::data {

class ChatTemplate;
class HfTokenizer;

struct ConversationOptions {
  std::string tokenizer;               // a tokenizer.json, or its directory
  std::string chat_template;           // a template file, or empty (above)
  std::string train_on = "assistant";  // "assistant" | "all"
  double val_fraction = 0.0;           // in [0, 1)
  int seq_len = 0;                     // > 0: report first-fit packing into windows of seq_len
};

struct ConversationResult {
  int64_t train_conversations = 0, val_conversations = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  int64_t trained_tokens = 0;  // of the train split, the mask's 1s
  std::vector<std::string> outputs;
  std::string template_source;  // which file the template came from
  std::string token_type;
  int64_t vocab_size = 0;
  int64_t windows = 0;  // with seq_len: the train split packed (data/sampler.h)
  double packing_efficiency = 0.0;
};

ConversationResult prepare_conversations(const std::string& jsonl, const std::string& out_path,
                                         const ConversationOptions& options);

// One conversation rendered, and the byte ranges [begin, end) of its text that are trained.
struct RenderedConversation {
  std::string text;
  std::vector<std::pair<size_t, size_t>> trained;
};
// messages: a JSON array of message objects; special: the template's variables besides them
// (bos_token, ...). `where` names the conversation in errors.
RenderedConversation render_conversation(const ChatTemplate& tmpl,
                                         const nlohmann::ordered_json& special,
                                         const nlohmann::ordered_json& messages, bool train_all,
                                         const std::string& where);

}  // namespace strata::data
