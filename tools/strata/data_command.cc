#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "strata/data/prepare.h"
#include "strata/data/token_dataset.h"
#include "tools/strata/commands.h"

namespace strata::cli {

namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string output;
  std::string format = "llmc";
  double val_fraction = 0.0;
};

struct InspectArgs {
  std::string path;
  std::string format = "auto";
};

}  // namespace

void add_data_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("data", "Prepare and inspect token datasets");
  cmd->require_subcommand(1);

  auto prep = std::make_shared<PrepareArgs>();
  CLI::App* p = cmd->add_subcommand(
      "prepare", "Tokenize text files (byte-level) into an llm.c or Megatron dataset");
  p->add_option("--input,-i", prep->inputs, "text files or directories (recursive)")->required();
  p->add_option("--output,-o", prep->output,
                "output prefix: writes PREFIX_train and PREFIX_val datasets; into an existing "
                "directory (or a path ending in /): DIR/train and DIR/val")
      ->required();
  p->add_option("--format", prep->format, "llmc | megatron")
      ->check(CLI::IsMember({"llmc", "megatron"}));
  p->add_option("--val-fraction", prep->val_fraction,
                "fraction of the tokens (the end of the stream) held out for validation")
      ->check(CLI::Range(0.0, 0.5));
  p->callback([prep] {
    data::PrepareResult r =
        data::prepare_text_dataset(prep->inputs, prep->output, prep->format, prep->val_fraction);
    std::string written;
    for (const std::string& f : r.outputs) written += (written.empty() ? "" : ", ") + f;
    std::printf("%lld documents, %lld train tokens, %lld val tokens, %lld files skipped -> %s\n",
                static_cast<long long>(r.documents), static_cast<long long>(r.train_tokens),
                static_cast<long long>(r.val_tokens), static_cast<long long>(r.files_skipped),
                written.c_str());
  });

  auto insp = std::make_shared<InspectArgs>();
  CLI::App* i = cmd->add_subcommand("inspect", "Validate a dataset and print its size");
  i->add_option("path", insp->path, "llm.c shard(s), glob, directory or Megatron prefix")
      ->required();
  i->add_option("--format", insp->format, "auto | llmc | megatron")
      ->check(CLI::IsMember({"auto", "llmc", "megatron"}));
  i->callback([insp] {
    auto ds = data::open_dataset(insp->path, insp->format);
    std::printf("%s: %lld tokens, largest token id %lld\n", insp->path.c_str(),
                static_cast<long long>(ds->num_tokens()),
                static_cast<long long>(ds->vocab_bound() - 1));
  });
}

}  // namespace strata::cli
