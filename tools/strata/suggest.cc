#include "tools/strata/suggest.h"

#include "strata/core/text.h"

namespace strata::cli {

namespace {

std::string command_name(const std::vector<const CLI::App*>& path) {
  std::string name;
  for (const CLI::App* a : path) name += (name.empty() ? "" : " ") + a->get_name();
  return name;
}

// Every spelling of an option of `app`: --long and -s.
std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : o->get_snames()) names.push_back("-" + s);
  }
  return names;
}

// A suggestion only where the word is plausibly a misspelling: at most a third of it differs.
bool close_enough(const std::string& word, const std::string& candidate) {
  return !candidate.empty() &&
         edit_distance(word, candidate) <= std::max<size_t>(2, word.size() / 3);
}

}  // namespace

std::vector<std::string> suggestions(const CLI::App& app, int argc, const char* const* argv) {
  std::vector<std::string> out;
  std::vector<const CLI::App*> path{&app};
  bool positional_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const CLI::App& here = *path.back();
    if (arg == "--") {
      positional_only = true;
      continue;
    }
    if (positional_only) continue;
    if (arg.size() > 1 && arg[0] == '-') {
      const std::string name = arg.substr(0, arg.find('='));
      const CLI::Option* opt = nullptr;
      for (const CLI::Option* o : here.get_options()) {
        if (o->check_name(name)) opt = o;
      }
      if (opt == nullptr) {
        if (name == "--help" || name == "-h") continue;
        const std::string near = nearest(name, option_names(here));
        out.push_back("unknown option " + name + " of '" + command_name(path) + "'" +
                      (close_enough(name, near) ? ": did you mean " + near + "?"
                                                : "; see '" + command_name(path) + " --help'"));
        continue;
      }
      // Skip the values this option reads (all words up to the next flag for a list).
      if (opt->get_type_size_max() > 0 && arg.find('=') == std::string::npos) {
        const int most = opt->get_items_expected_max();
        for (int k = 0; k < most && i + 1 < argc && argv[i + 1][0] != '-'; ++k) ++i;
      }
      continue;
    }
    std::vector<std::string> subcommands;
    const CLI::App* sub = nullptr;
    for (const CLI::App* s : here.get_subcommands({})) {
      subcommands.push_back(s->get_name());
      if (s->check_name(arg)) sub = s;
    }
    if (sub != nullptr) {
      path.push_back(sub);
    } else if (!subcommands.empty() && here.get_require_subcommand_min() > 0) {
      const std::string near = nearest(arg, subcommands);
      std::string all;
      for (const std::string& s : subcommands) all += (all.empty() ? "" : ", ") + s;
      out.push_back(
          "unknown command '" + arg + "' of '" + command_name(path) + "'" +
          (close_enough(arg, near) ? ": did you mean '" + near + "'?" : "; one of: " + all));
      break;
    }
  }
  return out;
}

}  // namespace strata::cli
