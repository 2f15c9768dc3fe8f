#include "strata/data/jinja.h"

#include "strata/core/check.h"
#include "strata/data/hf_tokenizer.h"
#include "strata/data/jinja_eval.h"
#include "strata/data/jinja_syntax.h"

namespace strata::data {

ChatTemplate::ChatTemplate(std::string source, std::string name) {
  auto program = std::make_unique<jinja::Program>();
  program->name = std::move(name);
  if (const auto bad = first_invalid_utf8(source)) {
    STRATA_INPUT_FAIL("chat template '", program->name, "': byte ", *bad,
                      " is not well-formed UTF-8");
  }
  try {
    jinja::parse(source, *program);
  } catch (const jinja::TemplateSyntax& e) {
    STRATA_INPUT_FAIL("chat template '", program->name, "', line ", e.pos.line, " column ",
                      e.pos.col, ": ", e.message);
  } catch (const jinja::TemplateError& e) {
    STRATA_INPUT_FAIL("chat template '", program->name, "': ", e.message);
  }
  program_ = std::move(program);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render(context, nullptr);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context,
                                 std::vector<std::pair<size_t, size_t>>* generation_spans) const {
  STRATA_INPUT_CHECK(context.is_object(), "chat template '", program_->name,
                     "': the render context must be a JSON object, not ", context.type_name());
  if (generation_spans != nullptr) generation_spans->clear();
  auto globals = std::make_shared<jinja::Scope>();
  jinja::add_globals(*globals);
  jinja::Evaluator ev(*program_, globals);
  try {
    for (const auto& [key, value] : context.items()) globals->set(key, jinja::from_json(value));
    return ev.run(generation_spans);
  } catch (const jinja::TemplateError& e) {
    if (e.raised) {
      STRATA_INPUT_FAIL("chat template '", program_->name, "' raised an exception at line ",
                        ev.pos().line, ": ", e.message);
    }
    STRATA_INPUT_FAIL("chat template '", program_->name, "', line ", ev.pos().line, " column ",
                      ev.pos().col, ": ", e.message);
  }
}

bool ChatTemplate::has_generation_blocks() const {
  return program_->has_generation;
}

const std::string& ChatTemplate::name() const {
  return program_->name;
}

}  // namespace strata::data
