// transformers' tojson (json.dumps with its options, Python's output byte for byte) and the render
// context's JSON as values (jinja_value.h).
#include <algorithm>
#include <cmath>

#include "strata/data/jinja_text.h"
#include "strata/data/jinja_value.h"

namespace strata::data::jinja {
namespace {

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  static const char* hex = "0123456789abcdef";
  auto u_escape = [&](char32_t c) {
    out += "\\u";
    for (int k = 3; k >= 0; --k) out.push_back(hex[(c >> (4 * k)) & 0xf]);
  };
  out.push_back('"');
  for (char32_t c : decode_utf8(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
      if (c > 0xffff) {
        const char32_t v = c - 0x10000;
        u_escape(0xd800 | (v >> 10));
        u_escape(0xdc00 | (v & 0x3ff));
      } else {
        u_escape(c);
      }
    } else {
      append_utf8(out, c);
    }
  }
  out.push_back('"');
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
  return float_repr(f);
}

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case Kind::kString:
      return k.str();
    case Kind::kNone:
      return "null";
    case Kind::kBool:
      return k.as_bool() ? "true" : "false";
    case Kind::kInt:
      return std::to_string(k.as_int());
    case Kind::kFloat:
      return json_float(k.as_double());
    default:
      fail("keys must be str, int, float, bool or None, not " + type_name(k));
  }
}

void append_json(std::string& out, const Value& v, const JsonOptions& o, int level) {
  const std::string item_sep = o.separators ? o.separators->first : o.indent ? "," : ", ";
  const std::string key_sep = o.separators ? o.separators->second : ": ";
  auto newline = [&](int depth) {
    if (!o.indent) return;
    out.push_back('\n');
    for (int k = 0; k < depth; ++k) out += *o.indent;
  };
  switch (v.kind()) {
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Kind::kFloat:
      out += json_float(v.as_double());
      return;
    case Kind::kString:
      append_json_string(out, v.str(), o.ensure_ascii);
      return;
    case Kind::kSeq: {
      const Sequence& s = v.seq();
      if (s.kind != SeqKind::kList && s.kind != SeqKind::kTuple) break;
      if (s.items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < s.items.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(level + 1);
        append_json(out, s.items[i], o, level + 1);
      }
      newline(level);
      out.push_back(']');
      return;
    }
    case Kind::kDict: {
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& item : v.dict().items) items.push_back(&item);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return less(a->first, b->first); });
      }
      if (items.empty()) {
        out += "{}";
        return;
      }
      out.push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += item_sep;
        newline(level + 1);
        append_json_string(out, json_key(items[i]->first), o.ensure_ascii);
        out += key_sep;
        append_json(out, items[i]->second, o, level + 1);
      }
      newline(level);
      out.push_back('}');
      return;
    }
    default:
      break;
  }
  fail("Object of type " + type_name(v) + " is not JSON serializable");
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  append_json(out, v, options, 0);
  return out;
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) fail("the integer " + std::to_string(u) + " is above 2^63 - 1");
      return Value::integer(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      d->items.reserve(j.size());
      for (const auto& [k, e] : j.items()) d->items.emplace_back(Value::string(k), from_json(e));
      return Value::dict(std::move(d));
    }
    default:
      fail("a binary JSON value has no Python equivalent");
  }
}

}  // namespace strata::data::jinja
