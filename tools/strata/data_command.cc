#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/data/conversations.h"
#include "strata/data/hf_tokenizer.h"
#include "strata/data/inspect.h"
#include "strata/data/prepare.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string output;
  data::PrepareOptions options;
  std::string jsonl;
  data::ConversationOptions chat;
  bool llmc_asked = false;
};

void prepare_conversations(const PrepareArgs& a) {
  STRATA_INPUT_CHECK(a.inputs.empty(),
                     "give --input (text files) or --jsonl (conversations), not "
                     "both");
  STRATA_INPUT_CHECK(!a.llmc_asked,
                     "--jsonl writes a Megatron dataset (its index keeps the "
                     "conversations apart, which packing needs); drop --format llmc");
  data::ConversationOptions o = a.chat;
  o.tokenizer = a.options.tokenizer;
  o.val_fraction = a.options.val_fraction;
  const data::ConversationResult r = data::prepare_conversations(a.jsonl, a.output, o);
  std::string written;
  for (const std::string& f : r.outputs) written += (written.empty() ? "" : ", ") + f;
  std::printf(
      "%lld conversations, %lld train tokens (%lld trained, %.1f%%), %lld val "
      "conversations, %lld val tokens -> %s\n",
      static_cast<long long>(r.train_conversations + r.val_conversations),
      static_cast<long long>(r.train_tokens), static_cast<long long>(r.trained_tokens),
      r.train_tokens > 0 ? 100.0 * double(r.trained_tokens) / double(r.train_tokens) : 0.0,
      static_cast<long long>(r.val_conversations), static_cast<long long>(r.val_tokens),
      written.c_str());
  std::printf("chat template from %s; trained: %s; vocabulary %lld ids, %s tokens\n",
              r.template_source.c_str(),
              o.train_on == "all" ? "every token" : "the assistant's turns",
              static_cast<long long>(r.vocab_size), r.token_type.c_str());
  if (o.seq_len > 0) {
    std::printf("packed first-fit into %lld windows of %d: packing efficiency %.1f%%\n",
                static_cast<long long>(r.windows), o.seq_len, 100.0 * r.packing_efficiency);
  }
}

struct InspectArgs {
  std::string path;
  std::string format = "auto";
  int64_t vocab = 0;
  std::string tokenizer;
};

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s.empty() ? "none" : s;
}

}  // namespace

void add_data_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("data", "Prepare and inspect token datasets");
  cmd->require_subcommand(1);

  auto prep = std::make_shared<PrepareArgs>();
  CLI::App* p = cmd->add_subcommand(
      "prepare",
      "Tokenize text files (byte-level, or with a Hugging Face tokenizer.json) into an "
      "llm.c or Megatron dataset");
  p->add_option("--input,-i", prep->inputs, "text files or directories (recursive)");
  p->add_option("--jsonl", prep->jsonl,
                "conversations, one JSON object a line ({\"messages\": [...]} or "
                "{\"prompt\": ..., \"completion\": ...}), rendered with the chat template into "
                "a Megatron dataset and its loss mask (PREFIX.lossmask); needs --tokenizer");
  p->add_option("--chat-template", prep->chat.chat_template,
                "a Jinja chat template file (default: chat_template.jinja beside the tokenizer, "
                "else tokenizer_config.json's chat_template)");
  p->add_option("--train-on", prep->chat.train_on,
                "which tokens of a conversation are trained: assistant (its turns) or all")
      ->check(CLI::IsMember({"assistant", "all"}));
  p->add_option("--seq-len", prep->chat.seq_len,
                "report how the conversations pack first-fit into windows of this length")
      ->check(CLI::PositiveNumber);
  p->add_option("--output,-o", prep->output,
                "output prefix: writes PREFIX_train and PREFIX_val datasets; into an existing "
                "directory (or a path ending in /): DIR/train and DIR/val")
      ->required();
  p->add_option_function<std::string>(
       "--format",
       [prep](const std::string& f) {
         prep->options.format = f;
         prep->llmc_asked = f == "llmc";
       },
       "llmc | megatron (--jsonl: megatron)")
      ->check(CLI::IsMember({"llmc", "megatron"}));
  p->add_option("--val-fraction", prep->options.val_fraction,
                "fraction of the tokens (the end of the stream) held out for validation")
      ->check(CLI::Range(0.0, 0.5));
  p->add_option("--tokenizer", prep->options.tokenizer,
                "a Hugging Face tokenizer.json (or its directory): byte-level BPE as GPT-2 and "
                "Llama-3 use it; default: one token per byte");
  p->add_flag("--append-eod", prep->options.append_eod,
              "end each document with the end-of-text token (Megatron's --append-eod) instead "
              "of opening it with it; with a BOS template, after the document");
  p->callback([prep] {
    if (!prep->jsonl.empty()) return prepare_conversations(*prep);
    STRATA_INPUT_CHECK(!prep->inputs.empty(),
                       "data prepare needs --input (text files) or --jsonl (conversations)");
    data::PrepareResult r = data::prepare_text_dataset(prep->inputs, prep->output, prep->options);
    std::string written;
    for (const std::string& f : r.outputs) written += (written.empty() ? "" : ", ") + f;
    std::printf("%lld documents, %lld train tokens, %lld val tokens, %lld files skipped -> %s\n",
                static_cast<long long>(r.documents), static_cast<long long>(r.train_tokens),
                static_cast<long long>(r.val_tokens), static_cast<long long>(r.files_skipped),
                written.c_str());
    std::printf("vocabulary %lld ids, %s tokens; each document: [%s] text [%s]\n",
                static_cast<long long>(r.vocab_size), r.token_type.c_str(),
                ids_text(r.doc_prefix).c_str(), ids_text(r.doc_suffix).c_str());
  });

  auto insp = std::make_shared<InspectArgs>();
  CLI::App* i = cmd->add_subcommand("inspect", "Validate a dataset and print its size");
  i->add_option("path", insp->path, "llm.c shard(s), glob, directory or Megatron prefix")
      ->required();
  i->add_option("--format", insp->format, "auto | llmc | megatron")
      ->check(CLI::IsMember({"auto", "llmc", "megatron"}));
  auto* vocab = i->add_option("--vocab", insp->vocab,
                              "the model's vocabulary size: every id must be below it")
                    ->check(CLI::PositiveNumber);
  i->add_option("--tokenizer", insp->tokenizer,
                "a tokenizer.json (or its directory): its vocabulary, and its document token for "
                "counting llm.c documents")
      ->excludes(vocab);
  i->callback([insp] {
    std::optional<int32_t> delimiter;
    int64_t vocab_size = insp->vocab;
    if (!insp->tokenizer.empty()) {
      const auto tok = data::HfTokenizer::load(insp->tokenizer);
      vocab_size = tok->vocab_size();
      delimiter = tok->template_prefix().empty() ? data::end_of_text_id(*tok)
                                                 : tok->template_prefix().front();
    }
    const data::DatasetSummary s = data::summarize_dataset(insp->path, insp->format, delimiter);
    std::printf("%s: %lld tokens, largest token id %lld\n", insp->path.c_str(),
                static_cast<long long>(s.tokens), static_cast<long long>(s.max_id));
    std::printf("format %s, dtype %s\n", s.format.c_str(), s.token_type.c_str());
    if (s.format.find("llmc") != std::string::npos && s.delimiter) {
      std::printf("documents %lld (occurrences of id %d, the document token)\n",
                  static_cast<long long>(s.documents), *s.delimiter);
    } else {
      std::printf("documents %lld (from the index)\n", static_cast<long long>(s.documents));
    }
    if (s.trained >= 0) {
      std::printf("loss mask: %lld of the %lld tokens trained (%.1f%%)\n",
                  static_cast<long long>(s.trained), static_cast<long long>(s.tokens),
                  s.tokens > 0 ? 100.0 * double(s.trained) / double(s.tokens) : 0.0);
    }
    if (vocab_size > 0) {
      const bool fits = s.max_id < vocab_size;
      std::printf("vocabulary %lld: %s\n", static_cast<long long>(vocab_size),
                  fits ? "every id fits" : "ids out of range");
      STRATA_INPUT_CHECK(fits, insp->path, ": token id ", s.max_id, " is not below the vocabulary ",
                         vocab_size, "; the data was made with another tokenizer, or the model's ",
                         "vocab is too small");
    }
  });
}

}  // namespace strata::cli
