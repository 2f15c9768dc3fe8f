// Chat templates: the Jinja2 subset that Hugging Face chat templates use, rendering byte for byte
// what transformers' apply_chat_template renders (jinja2's ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and loopcontrols; raise_exception, strftime_now and tojson as
// transformers defines them; the {% generation %} tag of its AssistantTracker).
//
// What is covered (anything else is refused with an InputError naming the template, the line and
// the column):
//   statements   text, {{ }}, {% %}, {# #}, whitespace control (-, +), raw, if/elif/else,
//                for (tuple targets, `if` filter, else, loop.*, break/continue), set (also
//                namespace attributes and {% set x %}...{% endset %}), macro, call, filter,
//                with, print, generation
//   expressions  Python literals, attribute/item access, slices, arithmetic with Python's
//                semantics (floor division and modulo, int/float), ~, comparisons, and/or/not,
//                in/not in, `is` tests, conditional expressions, filters and calls
//   values       Undefined as jinja2's default Undefined; str() and repr() of Python values
//                (True, None, 1.0, ['a', 1], {'a': 1}); Python str/dict/list methods
//   filters      abs attr batch capitalize center count d default dictsort e escape first float
//                forceescape format indent int items join last length list lower map max min
//                reject rejectattr replace reverse round safe select selectattr sort string sum
//                title tojson trim truncate unique upper wordcount
//   tests        every jinja2 test
// Integers are 64-bit (Python's are unbounded): an overflow is an error, not a wrong number.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace strata::data {

namespace jinja {
struct Program;
}

class ChatTemplate {
 public:
  // Parses `source`. Throws InputError naming `name`, the line and column and what is wrong for a
  // syntax error or anything unsupported (an unknown filter or test, include, extends, ...).
  ChatTemplate(std::string source, std::string name);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // Renders with the variables of `context`, a JSON object: messages, add_generation_prompt,
  // bos_token, eos_token, tools, and any extra keyword (enable_thinking, ...). Objects keep their
  // key order (what `tojson` and `items` show), so parse into nlohmann::ordered_json; a
  // nlohmann::json converts, with its keys sorted. Throws InputError naming the template and the
  // line for a run-time error, and for raise_exception(msg) with msg in the message.
  // Thread-safe: a ChatTemplate is not changed by rendering.
  std::string render(const nlohmann::ordered_json& context) const;
  // The same, and the byte ranges [begin, end) of the output that {% generation %} blocks wrote
  // (transformers' return_assistant_tokens_mask, in bytes where transformers counts characters);
  // empty when there are none.
  std::string render(const nlohmann::ordered_json& context,
                     std::vector<std::pair<size_t, size_t>>* generation_spans) const;

  // Whether the template has {% generation %} ... {% endgeneration %} blocks.
  bool has_generation_blocks() const;
  const std::string& name() const;

 private:
  std::unique_ptr<const jinja::Program> program_;
};

}  // namespace strata::data
