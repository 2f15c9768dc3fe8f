// The block reader with its typed getters, JSON text without duplicate keys or runaway nesting,
// and --set overrides.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <set>
#include <utility>

#include "strata/config/internal.h"
#include "strata/core/check.h"

namespace strata::config_detail {

namespace {

std::string fmt_num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// The message for a config nesting past kMaxConfigDepth; `at` locates it ("" when unknown).
std::string too_deep_message(std::string_view at) {
  return detail::concat("the JSON nests deeper than ", kMaxConfigDepth, " levels",
                        at.empty() ? "" : " (at ", at, at.empty() ? "" : ")",
                        "; strata's configs nest 4 levels at most (optimizer.params.betas): look "
                        "for runaway brackets");
}

}  // namespace

// ---- the block reader ----

Block::Block(const json* j, std::string path, const Keys& keys, bool auto_means_default,
             ConfigErrors* errors)
    : j_(j), path_(std::move(path)), auto_means_default_(auto_means_default), errors_(errors) {
  if (j_ == nullptr) return;
  if (!j_->is_object()) {
    const std::string what = show(*j_);
    j_ = nullptr;  // read as absent: every getter leaves its default
    report(path_.empty() ? "the config must be a JSON object, got " + what
                         : path_ + " must be a block (a JSON object), got " + what);
    return;
  }
  for (const auto& [key, v] : j_->items()) {
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      report(unknown_key_message(path_, key, keys));
    }
  }
}

void Block::report(const std::string& message) const {
  if (errors_ == nullptr) STRATA_INPUT_FAIL(message);
  errors_->add(message);
}

Block& Block::nullable(std::initializer_list<std::string_view> keys) {
  for (std::string_view k : keys) nullable_.emplace_back(k);
  return *this;
}

const json* Block::value(std::string_view key) const {
  if (j_ == nullptr) return nullptr;
  auto it = j_->find(key);
  if (it == j_->end()) return nullptr;
  if (auto_means_default_ && it->is_string() && it->get_ref<const std::string&>() == "auto") {
    return nullptr;
  }
  if (it->is_null() && std::find(nullable_.begin(), nullable_.end(), key) != nullable_.end()) {
    return nullptr;
  }
  return &*it;
}

bool Block::has(std::string_view key) const {
  return value(key) != nullptr;
}

bool Block::is_null(std::string_view key) const {
  if (j_ == nullptr) return false;
  auto it = j_->find(key);
  return it != j_->end() && it->is_null();
}

const json& Block::at(std::string_view key) const {
  const json* v = value(key);
  STRATA_CHECK(v != nullptr, key_path(key), " is not given");
  return *v;
}

std::string Block::fail_message(std::string_view key, std::string_view what) const {
  const json& v = j_->at(key);
  std::string hint;
  if (v.is_string() && v.get_ref<const std::string&>() == "auto") {
    hint =
        " (DeepSpeed takes \"auto\" only inside zero_optimization, fp16, bf16 and the monitor "
        "blocks; elsewhere the Hugging Face Trainer fills it in before DeepSpeed sees it)";
  }
  return key_path(key) + " must be " + std::string(what) + ", got " + show(v) + hint;
}

void Block::fail(std::string_view key, std::string_view what) const {
  STRATA_INPUT_FAIL(fail_message(key, what));
}

bool Block::bad(std::string_view key, std::string_view what) const {
  report(fail_message(key, what));
  return false;
}

bool Block::get_bool(std::string_view key, bool& out) const {
  const json* v = value(key);
  if (v == nullptr) return false;
  if (!v->is_boolean()) return bad(key, "true or false");
  out = v->get<bool>();
  return true;
}

bool Block::get_int(std::string_view key, int64_t& out, int64_t lo, int64_t hi) const {
  const json* v = value(key);
  if (v == nullptr) return false;
  std::string what = "an integer";
  if (lo != INT64_MIN && hi == INT64_MAX) what += " >= " + std::to_string(lo);
  if (hi != INT64_MAX) what += " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  int64_t x = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return bad(key, what);
    x = int64_t(u);
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else if (v->is_number_float()) {  // 5e8 for an integer key, as pydantic accepts
    const double d = v->get<double>();
    if (!std::isfinite(d) || std::trunc(d) != d || std::fabs(d) >= 9.2e18) return bad(key, what);
    x = int64_t(d);
  } else {
    return bad(key, what);
  }
  if (x < lo || x > hi) return bad(key, what);
  out = x;
  return true;
}

bool Block::get_int(std::string_view key, int& out, int lo, int hi) const {
  int64_t x = 0;
  if (!get_int(key, x, lo == INT_MIN ? INT64_MIN : lo, hi == INT_MAX ? INT64_MAX : hi))
    return false;
  if (x < INT_MIN || x > INT_MAX) return bad(key, "an integer within the range of int32");
  out = int(x);
  return true;
}

bool Block::get_uint64(std::string_view key, uint64_t& out) const {
  const json* v = value(key);
  if (v == nullptr) return false;
  if (v->is_number_unsigned()) {
    out = v->get<uint64_t>();
  } else if (v->is_number_integer()) {
    const int64_t x = v->get<int64_t>();
    if (x < 0) return bad(key, "an integer >= 0");
    out = uint64_t(x);
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || std::trunc(d) != d || d < 0 || d >= 18446744073709551616.0) {
      return bad(key, "an integer >= 0");
    }
    out = uint64_t(d);
  } else {
    return bad(key, "an integer >= 0");
  }
  return true;
}

bool Block::get_number(std::string_view key, double& out, double lo, double hi,
                       bool lo_open) const {
  const json* v = value(key);
  if (v == nullptr) return false;
  std::string what = "a finite number";
  if (hi == HUGE_VAL && lo != -HUGE_VAL) what += (lo_open ? " > " : " >= ") + fmt_num(lo);
  if (hi != HUGE_VAL) {
    what += std::string(" in ") + (lo_open ? "(" : "[") + fmt_num(lo) + ", " + fmt_num(hi) + "]";
  }
  if (!v->is_number()) return bad(key, what);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) return bad(key, what);
  out = d;
  return true;
}

bool Block::get_number(std::string_view key, float& out, double lo, double hi, bool lo_open) const {
  double d = 0;
  if (!get_number(key, d, lo, hi, lo_open)) return false;
  if (std::fabs(d) > double(FLT_MAX)) return bad(key, "a number within the range of fp32");
  out = float(d);
  return true;
}

bool Block::get_string(std::string_view key, std::string& out) const {
  const json* v = value(key);
  if (v == nullptr) return false;
  if (!v->is_string()) return bad(key, "a string");
  out = v->get<std::string>();
  return true;
}

bool Block::get_choice(std::string_view key, std::string& out, const Keys& allowed,
                       bool case_insensitive) const {
  const json* v = value(key);
  if (v == nullptr) return false;
  const std::string what = "one of " + list(allowed, true);
  if (!v->is_string()) return bad(key, what);
  const std::string& s = v->get_ref<const std::string&>();
  for (const std::string& a : allowed) {
    if (s == a || (case_insensitive && lower(s) == lower(a))) {
      out = a;
      return true;
    }
  }
  const std::string near = nearest(s, allowed);
  if (edit_distance(s, near) <= 2) {
    report(key_path(key) + " must be " + what + ", got " + show(*v) + "; did you mean \"" + near +
           "\"?");
    return false;
  }
  return bad(key, what);
}

Block Block::child(std::string_view key, const Keys& keys, bool auto_means_default) const {
  const json* v = value(key);
  if (v != nullptr && !v->is_object()) {
    bad(key, "a block (a JSON object)");
    v = nullptr;
  }
  return Block(v, key_path(key), keys, auto_means_default, errors_);
}

// ---- all of a config's errors ----

void ConfigErrors::add(std::string message) {
  if (std::find(messages_.begin(), messages_.end(), message) == messages_.end()) {
    messages_.push_back(std::move(message));
  }
}

void ConfigErrors::raise() const {
  STRATA_CHECK(!messages_.empty(), "no config errors to raise");
  if (messages_.size() == 1) STRATA_INPUT_FAIL(messages_[0]);
  std::string all = "the config has " + std::to_string(messages_.size()) + " errors:";
  for (const std::string& m : messages_) all += "\n  - " + m;
  STRATA_INPUT_FAIL(all);
}

// ---- JSON text ----

namespace {

// Builds the DOM like nlohmann's parser, and stops at the first key repeated in an object.
class StrictDom : public nlohmann::json_sax<json> {
 public:
  bool null() override { return put(json(nullptr)) != nullptr; }
  bool boolean(bool v) override { return put(json(v)) != nullptr; }
  bool number_integer(number_integer_t v) override { return put(json(v)) != nullptr; }
  bool number_unsigned(number_unsigned_t v) override { return put(json(v)) != nullptr; }
  bool number_float(number_float_t v, const string_t&) override { return put(json(v)) != nullptr; }
  bool string(string_t& v) override { return put(json(v)) != nullptr; }
  bool binary(binary_t& v) override { return put(json::binary(v)) != nullptr; }
  bool start_object(std::size_t) override {
    if (too_deep()) return false;
    frames_.push_back({put(json::object()), {}, {}});
    return true;
  }
  bool key(string_t& k) override {
    Frame& f = frames_.back();
    if (!f.keys.insert(k).second) {
      error_ = "duplicate key '" + path() + (path().empty() ? "" : ".") + k + "'";
      return false;
    }
    f.key = k;
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (too_deep()) return false;
    frames_.push_back({put(json::array()), {}, {}});
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    // "[json.exception.parse_error.101] parse error at line 3, column 1: syntax error ..."
    std::string what = ex.what();
    const size_t p = what.find("] ");
    error_ = p == std::string::npos ? what : what.substr(p + 2);
    invalid_ = true;
    return false;
  }

  json root;
  std::string error_;
  bool invalid_ = false;  // the text is not JSON (else valid JSON that strata refuses)

 private:
  struct Frame {
    json* value;
    std::set<std::string> keys;
    std::string key;
  };

  json* put(json v) {
    if (frames_.empty()) {
      root = std::move(v);
      return &root;
    }
    Frame& f = frames_.back();
    if (f.value->is_array()) {
      f.value->push_back(std::move(v));
      return &f.value->back();
    }
    json& slot = (*f.value)[f.key];
    slot = std::move(v);
    return &slot;
  }

  // Stops the parse before a container opens past the depth limit: the DOM is built without
  // recursion, but copying or dumping a tree recurses once per level.
  bool too_deep() {
    if (frames_.size() < size_t(kMaxConfigDepth)) return false;
    std::string at = path();
    if (at.size() > 40) at = at.substr(0, 40) + "...";
    error_ = too_deep_message(at);
    return true;
  }

  // The path of the innermost open value: object keys and array indices.
  std::string path() const {
    std::string r;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      const Frame& f = frames_[i];
      if (f.value->is_array()) {
        r += "[" + std::to_string(f.value->size() - 1) + "]";
      } else {
        r += (r.empty() ? "" : ".") + f.key;
      }
    }
    return r;
  }

  std::vector<Frame> frames_;
};

}  // namespace

}  // namespace strata::config_detail

namespace strata {

nlohmann::json parse_json_strict(std::string_view text, std::string_view origin) {
  config_detail::StrictDom dom;
  const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), &dom);
  if (!ok) STRATA_INPUT_FAIL(origin, ": ", dom.invalid_ ? "invalid JSON: " : "", dom.error_);
  return std::move(dom.root);
}

}  // namespace strata

namespace strata::config_detail {

void check_json_depth(const json& j, std::string_view origin) {
  // Recursion bounded by the limit: it returns at the first level past it.
  const auto depth_ok = [](const auto& self, const json& v, int depth) -> bool {
    if (!v.is_structured()) return true;
    if (depth >= kMaxConfigDepth) return false;
    for (const json& child : v) {
      if (!self(self, child, depth + 1)) return false;
    }
    return true;
  };
  STRATA_INPUT_CHECK(depth_ok(depth_ok, j, 0), origin, ": ", too_deep_message(""));
}

void apply_override(json& root, const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos) {
    STRATA_INPUT_FAIL(
        "--set \"", spec,
        "\": expected KEY=VALUE with a dotted key, e.g. --set zero_optimization.stage=2");
  }
  const std::string path = spec.substr(0, eq), text = spec.substr(eq + 1);
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const std::string& p : parts) {
    if (p.empty()) {
      STRATA_INPUT_FAIL("--set \"", spec, "\": the key path \"", path,
                        "\" is empty or has an empty part; write it as a.b.c");
    }
  }
  // JSON when it parses (numbers, true/false, objects, quoted strings), else the text itself.
  json value = json::accept(text) ? parse_json_strict(text, "--set \"" + spec + "\"") : json(text);

  json* cur = &root;
  std::string walked;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    walked = join_path(walked, parts[i]);
    json& next = (*cur)[parts[i]];
    if (next.is_null()) next = json::object();
    if (!next.is_object()) {
      STRATA_INPUT_FAIL("--set \"", spec, "\": ", walked, " is ", show(next),
                        ", not a block; set it whole instead, e.g. --set ", walked, "=...");
    }
    cur = &next;
  }
  STRATA_CHECK(cur->is_object(), "overrides apply to a JSON object");
  (*cur)[parts.back()] = std::move(value);
}

}  // namespace strata::config_detail
