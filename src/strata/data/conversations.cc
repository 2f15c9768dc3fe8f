#include "strata/data/conversations.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "strata/core/check.h"
#include "strata/data/hf_tokenizer.h"
#include "strata/data/jinja.h"
#include "strata/data/loss_mask.h"
#include "strata/data/megatron_dataset.h"
#include "strata/data/prepare.h"
#include "strata/data/sampler.h"
#include "strata/data/token_dataset.h"

namespace strata::data {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

std::string read_text(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  STRATA_INPUT_CHECK(in.good(), "cannot read ", what, " ", path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The chat template and the special tokens it may use (bos_token, ...), from the options and the
// files beside the tokenizer.
struct TemplateSource {
  std::unique_ptr<ChatTemplate> tmpl;
  ojson special = ojson::object();
  std::string origin;
};

TemplateSource load_template(const ConversationOptions& o) {
  const fs::path dir =
      fs::is_directory(o.tokenizer) ? fs::path(o.tokenizer) : fs::path(o.tokenizer).parent_path();
  TemplateSource t;
  const std::string config_path = (dir / "tokenizer_config.json").string();
  ojson config = ojson::object();
  if (fs::exists(config_path)) {
    try {
      config = ojson::parse(read_text(config_path, "tokenizer config"));
    } catch (const nlohmann::json::exception& e) {
      STRATA_INPUT_FAIL(config_path, ": not valid JSON (", e.what(), ")");
    }
    STRATA_INPUT_CHECK(config.is_object(), config_path, ": expected a JSON object");
  }
  // transformers hands the template its special tokens map: each *_token as its text.
  for (const auto& [key, value] : config.items()) {
    if (key.size() < 6 || key.compare(key.size() - 6, 6, "_token") != 0) continue;
    if (value.is_string()) t.special[key] = value;
    if (value.is_object() && value.contains("content") && value["content"].is_string())
      t.special[key] = value["content"];
  }
  if (config.contains("additional_special_tokens"))
    t.special["additional_special_tokens"] = config["additional_special_tokens"];

  std::string source;
  const std::string beside = (dir / "chat_template.jinja").string();
  if (!o.chat_template.empty()) {
    source = read_text(o.chat_template, "chat template");
    t.origin = o.chat_template;
  } else if (fs::exists(beside)) {
    source = read_text(beside, "chat template");
    t.origin = beside;
  } else if (config.contains("chat_template")) {
    const ojson& c = config["chat_template"];
    if (c.is_string()) {
      source = c.get<std::string>();
    } else if (c.is_array()) {  // named templates: the default one
      std::string names;
      for (const ojson& e : c) {
        if (!e.is_object() || !e.contains("name") || !e["name"].is_string()) continue;
        names += (names.empty() ? "" : ", ") + e["name"].get<std::string>();
        if (e["name"] == "default" && e.contains("template") && e["template"].is_string())
          source = e["template"].get<std::string>();
      }
      STRATA_INPUT_CHECK(!source.empty(), config_path, ": chat_template lists templates (", names,
                         ") but none named \"default\"; give one with --chat-template");
    }
    t.origin = config_path;
  }
  STRATA_INPUT_CHECK(!t.origin.empty(), "no chat template: ", o.tokenizer,
                     " has neither chat_template.jinja nor a chat_template in "
                     "tokenizer_config.json; give one with --chat-template FILE, or train on "
                     "plain text with --input");
  t.tmpl = std::make_unique<ChatTemplate>(std::move(source), t.origin);
  return t;
}

// A line's conversation as a list of messages.
ojson messages_of(const ojson& line, const std::string& where) {
  STRATA_INPUT_CHECK(line.is_object(), where, ": expected a JSON object with \"messages\", or ",
                     "\"prompt\" and \"completion\"");
  ojson messages;
  if (line.contains("messages")) {
    messages = line["messages"];
  } else {
    STRATA_INPUT_CHECK(line.contains("prompt") && line.contains("completion"), where,
                       ": no \"messages\", and no \"prompt\" and \"completion\"; a conversation is "
                       "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, ...]} or "
                       "{\"prompt\": ..., \"completion\": ...}");
    const ojson &p = line["prompt"], &c = line["completion"];
    if (p.is_string() && c.is_string()) {
      messages = ojson::array(
          {{{"role", "user"}, {"content", p}}, {{"role", "assistant"}, {"content", c}}});
    } else {
      STRATA_INPUT_CHECK(p.is_array() && c.is_array(), where,
                         ": \"prompt\" and \"completion\" must both be strings (a user and an "
                         "assistant turn) or both lists of messages");
      messages = p;
      for (const ojson& m : c) messages.push_back(m);
    }
  }
  STRATA_INPUT_CHECK(messages.is_array() && !messages.empty(), where,
                     ": \"messages\" must be a non-empty list");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    STRATA_INPUT_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(), where,
                       ": message ", i, " has no \"role\" string");
  }
  return messages;
}

ojson context_of(const ojson& special, const ojson& messages, bool generation_prompt) {
  ojson ctx = special;
  ctx["messages"] = messages;
  ctx["tools"] = nullptr;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = generation_prompt;
  return ctx;
}

ojson first(const ojson& messages, size_t n) {
  return ojson(messages.begin(), messages.begin() + std::ptrdiff_t(n));
}

bool utf8_start(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
}

// Where an assistant turn lies in the whole rendering `text`, from byte `from`, when the template
// renders it there otherwise than as the last turn: `turn` is the conversation rendered through
// it, its text from byte `begin` (where the generation prompt ends). The longest end of that text
// holding the message's content `content` that `text` has at a place preceded by the same
// character as in `turn` (the end of the template's turn header: an end that starts inside the
// header is not the turn).
std::optional<std::pair<size_t, size_t>> find_turn(const std::string& text, size_t from,
                                                   const std::string& turn, size_t begin,
                                                   const std::string& content) {
  const std::string_view tail = std::string_view(turn).substr(begin);
  const size_t at = content.empty() ? 0 : tail.find(content);
  if (at == std::string::npos) return std::nullopt;
  for (size_t k = 0; k <= at; ++k) {
    if (!utf8_start(tail[k])) continue;
    const std::string_view end = tail.substr(k);
    for (size_t pos = text.find(end, from); pos != std::string::npos;
         pos = text.find(end, pos + 1)) {
      const bool header = begin + k == 0 || (pos > 0 && text[pos - 1] == turn[begin + k - 1]);
      if (header) return std::make_pair(pos, pos + end.size());
    }
  }
  return std::nullopt;
}

std::string trimmed_content(const ojson& m) {
  if (!m.contains("content") || !m["content"].is_string()) return {};
  std::string s = m["content"].get<std::string>();
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// The index in ids (the whole text's tokens) of the first token at or after byte c: the tokens
// of text[0, c) that the whole text's tokens begin with.
size_t token_at(HfTokenizer::Session& session, const std::string& text, size_t c,
                const std::vector<int32_t>& ids, std::vector<int32_t>& scratch) {
  if (c == 0) return 0;
  if (c >= text.size()) return ids.size();
  scratch.clear();
  session.encode_append(std::string_view(text).substr(0, c), scratch);
  size_t k = 0;
  while (k < scratch.size() && k < ids.size() && scratch[k] == ids[k]) ++k;
  return k;
}

struct Encoded {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  std::string error;
};

}  // namespace

RenderedConversation render_conversation(const ChatTemplate& tmpl, const ojson& special,
                                         const ojson& messages, bool train_all,
                                         const std::string& where) {
  RenderedConversation r;
  if (train_all || !tmpl.has_generation_blocks()) {
    r.text = tmpl.render(context_of(special, messages, false));
  } else {
    r.text = tmpl.render(context_of(special, messages, false), &r.trained);
    return r;
  }
  if (train_all) {
    r.trained.push_back({0, r.text.size()});
    return r;
  }
  size_t cursor = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    const std::string prompt = tmpl.render(context_of(special, first(messages, i), true));
    const std::string through = tmpl.render(context_of(special, first(messages, i + 1), false));
    size_t begin = 0;  // where the turn starts: where the two renderings part
    while (begin < prompt.size() && begin < through.size() && prompt[begin] == through[begin])
      ++begin;
    while (begin > 0 && !utf8_start(through[begin])) --begin;
    if (begin >= cursor && r.text.compare(0, through.size(), through) == 0) {
      r.trained.push_back({begin, through.size()});
      cursor = through.size();
      continue;
    }
    const std::string content = trimmed_content(messages[i]);
    const auto span = find_turn(r.text, cursor, through, begin, content);
    STRATA_INPUT_CHECK(span.has_value(), where, ": assistant message ", i,
                       " is not found in the conversation as the chat template renders it (the "
                       "template writes it differently when it is not the last turn); give a "
                       "template with {% generation %} blocks (--chat-template), or train on "
                       "every token with --train-on all");
    r.trained.push_back(*span);
    cursor = span->second;
  }
  return r;
}

ConversationResult prepare_conversations(const std::string& jsonl, const std::string& out_path,
                                         const ConversationOptions& o) {
  STRATA_INPUT_CHECK(o.train_on == "assistant" || o.train_on == "all", "--train-on \"", o.train_on,
                     "\": use assistant (the assistant's turns) or all");
  STRATA_INPUT_CHECK(o.val_fraction >= 0.0 && o.val_fraction < 1.0, "val fraction ", o.val_fraction,
                     " is outside [0, 1)");
  STRATA_INPUT_CHECK(!o.tokenizer.empty(),
                     "--jsonl needs --tokenizer: the model's tokenizer.json (its directory holds "
                     "tokenizer_config.json with the chat template)");
  const auto tok = HfTokenizer::load(o.tokenizer);
  const TemplateSource ts = load_template(o);
  const bool all = o.train_on == "all";

  // The conversations: non-empty lines, counted first for the split.
  std::ifstream in(jsonl, std::ios::binary);
  STRATA_INPUT_CHECK(in.good(), "cannot read ", jsonl);
  std::vector<int64_t> line_numbers;
  {
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") != std::string::npos) line_numbers.push_back(n);
    }
  }
  const int64_t total = int64_t(line_numbers.size());
  STRATA_INPUT_CHECK(total > 0, jsonl, ": no conversations (the file has no non-empty line)");
  int64_t val_n = 0;
  if (o.val_fraction > 0 && total >= 2)
    val_n = std::clamp<int64_t>(std::llround(o.val_fraction * double(total)), 1, total - 1);

  ConversationResult r;
  r.template_source = ts.origin;
  r.vocab_size = tok->vocab_size();
  const TokenType type = megatron_token_type_for_vocab(r.vocab_size);
  r.token_type = token_type_name(type);
  const std::string train_stem = prepare_output_stem(out_path, "train");
  struct Split {
    MegatronWriter tokens;
    LossMaskWriter mask;
    Split(const std::string& stem, TokenType type) : tokens(stem, type), mask(stem) {}
  };
  auto train = std::make_unique<Split>(train_stem, type);
  std::unique_ptr<Split> val;
  std::string val_stem;
  if (val_n > 0) {
    val_stem = prepare_output_stem(out_path, "val");
    val = std::make_unique<Split>(val_stem, type);
  }

  const int threads = omp_get_max_threads();
  std::vector<std::unique_ptr<HfTokenizer::Session>> sessions(static_cast<size_t>(threads));
  for (auto& s : sessions) s = std::make_unique<HfTokenizer::Session>(*tok);
  in.clear();
  in.seekg(0);
  constexpr size_t kChunk = 512;
  std::vector<std::string> lines;
  std::vector<Encoded> out;
  int64_t done = 0, line_no = 0;
  std::string line;
  while (done < total) {
    lines.clear();
    std::vector<int64_t> numbers;
    while (lines.size() < kChunk && std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      lines.push_back(line);
      numbers.push_back(line_no);
    }
    out.assign(lines.size(), Encoded{});
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < lines.size(); ++k) {
      const std::string where = jsonl + ":" + std::to_string(numbers[k]);
      Encoded& e = out[k];
      try {
        ojson parsed;
        try {
          parsed = ojson::parse(lines[k]);
        } catch (const nlohmann::json::exception& ex) {
          STRATA_INPUT_FAIL(where, ": not valid JSON (", ex.what(), ")");
        }
        const RenderedConversation c =
            render_conversation(*ts.tmpl, ts.special, messages_of(parsed, where), all, where);
        HfTokenizer::Session& session = *sessions[size_t(omp_get_thread_num())];
        session.encode_append(c.text, e.ids);
        e.mask.assign(e.ids.size(), 0);
        std::vector<int32_t> scratch;
        for (const auto& [b, end] : c.trained) {
          const size_t t0 = token_at(session, c.text, b, e.ids, scratch);
          const size_t t1 = token_at(session, c.text, end, e.ids, scratch);
          std::fill(e.mask.begin() + std::ptrdiff_t(t0), e.mask.begin() + std::ptrdiff_t(t1), 1);
        }
      } catch (const std::exception& ex) {
        e.error = ex.what();
      }
    }
    for (size_t k = 0; k < out.size(); ++k) {
      STRATA_INPUT_CHECK(out[k].error.empty(), out[k].error);
      const bool to_val = done >= total - val_n;
      Split& s = to_val ? *val : *train;
      const int64_t n = int64_t(out[k].ids.size());
      s.tokens.add_document(out[k].ids.data(), n);
      s.mask.append(out[k].mask.data(), n);
      if (to_val) {
        ++r.val_conversations, r.val_tokens += n;
      } else {
        ++r.train_conversations, r.train_tokens += n;
        r.trained_tokens += std::count(out[k].mask.begin(), out[k].mask.end(), uint8_t(1));
      }
      ++done;
    }
  }
  for (auto [s, stem] : {std::pair{train.get(), train_stem}, std::pair{val.get(), val_stem}}) {
    if (s == nullptr) continue;
    s->tokens.commit();  // removes a stale mask under the prefix, then the new one follows
    s->mask.commit();
    for (const char* ext : {".bin", ".idx", ".lossmask"}) r.outputs.push_back(stem + ext);
  }
  if (o.seq_len > 0) {
    const auto ds = open_dataset(train_stem, "megatron");
    const Sampler packed(*ds, o.seq_len, 0, SamplerOptions{.pack = true});
    r.windows = packed.num_windows();
    r.packing_efficiency = packed.packing_efficiency();
  }
  return r;
}

}  // namespace strata::data
