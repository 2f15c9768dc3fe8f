// Renders a chat template file with a JSON context read from stdin, for the peer comparison
// against transformers (tests/data/chat_template_peer_test.sh).
//
//   render_chat_template TEMPLATE [--json] < context.json
//
// Prints the rendering as it is; with --json, a JSON object {"rendered": ..., "generation_spans":
// [[begin, end], ...]} (byte offsets). Exits 2 with the error on stderr when rendering fails.
#include <fstream>
#include <iostream>
#include <iterator>

#include "strata/data/jinja.h"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && std::string(argv[2]) != "--json")) {
    std::cerr << "usage: render_chat_template TEMPLATE [--json] < context.json\n";
    return 2;
  }
  try {
    std::ifstream in(argv[1], std::ios::binary);
    if (!in) {
      std::cerr << "cannot read " << argv[1] << "\n";
      return 2;
    }
    std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const strata::data::ChatTemplate tmpl(std::move(source), argv[1]);
    const auto context = nlohmann::ordered_json::parse(std::cin);
    std::vector<std::pair<size_t, size_t>> spans;
    const std::string rendered = tmpl.render(context, &spans);
    if (argc == 3) {
      nlohmann::ordered_json out;
      out["rendered"] = rendered;
      out["generation_spans"] = spans;
      std::cout << out.dump() << "\n";
    } else {
      std::cout << rendered;
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  return 0;
}
