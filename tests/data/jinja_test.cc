// The chat-template engine (strata/data/jinja.h): each construct against what jinja2 renders in
// transformers' environment (expected strings checked with jinja2 3.1 through transformers'
// render_jinja_template), errors with their line and column, and the real family templates of
// tests/data/chat_templates/ against transformers' renderings (the full comparison, every
// template on every conversation, is the peer test data_chat_template_peer).
#include "strata/data/jinja.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <regex>

#include "strata/core/check.h"

namespace strata::data {
namespace {

using Json = nlohmann::ordered_json;

std::string render(const std::string& source, const Json& context = Json::object()) {
  return ChatTemplate(source, "test").render(context);
}

// The InputError message of rendering (or parsing) `source`.
std::string error_of(const std::string& source, const Json& context = Json::object()) {
  try {
    render(source, context);
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no InputError for " << source;
  return "";
}

const Json& ctx() {
  static const Json c = Json::parse(R"({"xs": [1, 2, 3], "d": {"b": 1, "a": 2}, "s": "héllo"})");
  return c;
}

TEST(ChatTemplateTest, TrimBlocksAndLstripBlocksAsTransformers) {
  EXPECT_EQ(render("a\n  {% if true %}\n    x\n  {% endif %}\nb"), "a\n    x\nb");
  EXPECT_EQ(render("x\n    {% for i in xs %}\n    {{ i }}\n    {% endfor %}\ny", ctx()),
            "x\n    1\n    2\n    3\ny");
  // lstrip only from a line's start; text after %} on the same line stays.
  EXPECT_EQ(render("a  {% if true %}  x {% endif %}  b"), "a    x   b");
  EXPECT_EQ(render("{% if true %}   {% endif %}|"), "   |");
  // {{ }} is not lstripped, comments are; + keeps the indentation.
  EXPECT_EQ(render("  {{ 'v' }}\n  {# c #}\nz"), "  v\nz");
  EXPECT_EQ(render("a {%+ if true %}b{% endif %}"), "a b");
  EXPECT_EQ(render("\t{% if true %}tab{% endif %}\n  {# comment #}  after"), "tab  after");
}

TEST(ChatTemplateTest, WhitespaceControlMarkers) {
  EXPECT_EQ(render("{%- if true -%}  x  {%- endif -%}  y"), "xy");
  EXPECT_EQ(render("{% for i in xs -%}\n  {{ i }}\n{%- endfor %}", ctx()), "123");
  EXPECT_EQ(render("line1\n{#- c -#}\nline2"), "line1line2");
  EXPECT_EQ(render("  {{- 'v' -}}  \nw"), "vw");
  EXPECT_EQ(render("{%- raw -%}  {{ x }}  {%- endraw -%}\nz"), "{{ x }}z");
}

TEST(ChatTemplateTest, NewlinesNormalizedAndOneTrailingNewlineDropped) {
  EXPECT_EQ(render("{% set x = 'a' %}\r\n{{ x }}\r\nend\r\n"), "a\nend");
  EXPECT_EQ(render("text\n\n"), "text\n");
  EXPECT_EQ(render("{{ \"a\\\nb\" }}"), "ab");
}

TEST(ChatTemplateTest, PythonPrinting) {
  EXPECT_EQ(render("{{ true }} {{ none }} {{ None }} {{ 1.0 }} {{ 7 / 7 }} {{ -0.0 }}"),
            "True None None 1.0 1.0 -0.0");
  EXPECT_EQ(render("{{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }}"),
            "1e+20 1e+16 1000000000000000.0 0.0001 1e-05 0.3333333333333333");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': 'v'}, ('t',)] }}"),
            "[1, 'a', None, True, 1.5, {'k': 'v'}, ('t',)]");
  EXPECT_EQ(render(R"({{ ["it's", 'a"b', 'c\'"d', '\n\t\x01é\u200b'] }})"),
            R"(["it's", 'a"b', 'c\'"d', '\n\t\x01é\u200b'])");
  EXPECT_EQ(render("{{ (1, 2) }} {{ () }} {{ 1, 2 }} {{ d.items() }} {{ range(3) }}", ctx()),
            "(1, 2) () (1, 2) dict_items([('b', 1), ('a', 2)]) range(0, 3)");
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{{ ns }}"), "<Namespace {'a': 1}>");
}

TEST(ChatTemplateTest, StringLiteralsAsPython) {
  EXPECT_EQ(render(R"({{ 'a\x41\u00e9\n\d' }}|{{ "a" "b" 'c' }})"), "aAé\n\\d|abc");
  EXPECT_EQ(render(R"({{ '\U0001F600\101\t' }}|{{ '\é' }})"), "\U0001F600A\t|\\xe9");
  EXPECT_EQ(render("{{ 1_000 }} {{ 0x10 }} {{ 0b11 }} {{ 0o17 }} {{ 1e3 }}"),
            "1000 16 3 15 1000.0");
}

TEST(ChatTemplateTest, ArithmeticWithPythonSemantics) {
  EXPECT_EQ(render("{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** -1 }} {{ -7.5 // 2 }} "
                   "{{ 5 % 2.5 }}"),
            "-4 2 -2 0.5 -4.0 0.0");
  EXPECT_EQ(render("{{ 1 + 1.0 }} {{ true + true }} {{ 2 ** 10 }} {{ -2 ** 2 }} {{ 10.5 // 3 }}"),
            "2.0 2 1024 4 3.0");
  EXPECT_EQ(render("{{ 3 * 'ab' }}{{ [1] * 2 }} {{ 'a' ~ 1 ~ none ~ true ~ 1.5 }} {{ 'a' + 'b' }}"),
            "ababab[1, 1] a1NoneTrue1.5 ab");
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("can only concatenate str (not \"int\") to str"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 10 // 0 }}").find("integer division or modulo by zero"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 2 ** 70 }}").find("integer overflow"), std::string::npos);
}

TEST(ChatTemplateTest, ComparisonsAndLogic) {
  EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} "
                   "{{ [1] == (1,) }} {{ {'a': 1} == {'a': 1} }}"),
            "True False True True False True");
  EXPECT_EQ(render("{{ 1 and 2 }} {{ 0 or 'x' }} {{ none or [] }} {{ not none }} {{ '' and 1 }}"),
            "2 x [] True ");
  EXPECT_EQ(render("{{ 'a' in 'cat' }} {{ 1 in xs }} {{ 'b' in d }} {{ 'z' not in d }} "
                   "{{ 'x' in undefined_x }}",
                   ctx()),
            "True True True True False");
  EXPECT_EQ(render("{{ 'y' if true else 'n' }}|{{ 1 if false }}|"), "y||");
  EXPECT_NE(
      error_of("{{ 1 < 'a' }}").find("'<' not supported between instances of 'int' and 'str'"),
      std::string::npos);
}

TEST(ChatTemplateTest, AttributesItemsAndSlices) {
  const Json c = Json::parse(R"({"messages": [{"role": "system", "content": "S"},
                                              {"role": "user", "content": "U"}]})");
  EXPECT_EQ(render("{{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].role }} "
                   "{{ messages[1:] | length }} {{ messages.0.content }}",
                   c),
            "system S user 1 S");
  EXPECT_EQ(render("{{ xs[::2] }} {{ xs[::-1] }} {{ xs[-2:] }} {{ xs[10:] }} {{ s[::-1] }} "
                   "{{ s[1] }} {{ s[1:3] }}",
                   ctx()),
            "[1, 3] [3, 2, 1] [2, 3] [] olléh é él");
  EXPECT_EQ(render("{{ d.get('b') }} {{ d.get('z', 'def') }} {{ d.get('z') }} {{ d['a'] }}", ctx()),
            "1 def None 2");
}

TEST(ChatTemplateTest, UndefinedAsJinja2) {
  EXPECT_EQ(render("[{{ nope }}]{{ nope is defined }}{{ nope | length }}{{ nope ~ 'a' }}"),
            "[]False0a");
  EXPECT_EQ(render("[{{ d.missing }}]{{ d.missing is defined }}{{ xs[9] is defined }}", ctx()),
            "[]FalseFalse");
  EXPECT_EQ(render("{% for x in nope %}x{% endfor %}{{ nope | default('dflt') }}"), "dflt");
  EXPECT_NE(error_of("{{ nope.foo }}").find("'nope' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ d.missing.x }}", ctx()).find("'dict object' has no attribute 'missing'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ xs[9].x }}", ctx()).find("list object has no element 9"),
            std::string::npos);
  EXPECT_NE(error_of("{{ nope + 1 }}").find("'nope' is undefined"), std::string::npos);
}

TEST(ChatTemplateTest, Tests) {
  EXPECT_EQ(render("{{ nope is sequence }} {{ nope is iterable }} {{ d is sequence }} "
                   "{{ 'a' is sequence }} {{ true is number }} {{ 1 is integer }} "
                   "{{ true is integer }}",
                   ctx()),
            "True True True True True True False");
  EXPECT_EQ(
      render("{{ xs is sequence }} {{ xs is mapping }} {{ {} is mapping }} {{ 'x' is string }} "
             "{{ none is none }} {{ 1.5 is float }} {{ 1 is float }} {{ true is boolean }} "
             "{{ false is false }} {{ 0 is false }}",
             ctx()),
      "True False True True True True False True True False");
  EXPECT_EQ(
      render("{{ 7 is divisibleby 7 }} {{ 3 is odd }} {{ 2 is even }} {{ false is sameas false }} "
             "{{ 'a' is eq 'a' }} {{ 'a' is equalto 'b' }} {{ 2 is gt 1 }} {{ 'a' is in 'abc' }} "
             "{{ 'abc' is lower }} {{ 'upper' is filter }} {{ 'x' is test }} {{ 1 is not none }}"),
      "True True True True True False True True True True False True");
  EXPECT_EQ(render("{% if enable_thinking is defined and enable_thinking is false %}off{% endif %}",
                   Json{{"enable_thinking", false}}),
            "off");
}

TEST(ChatTemplateTest, Filters) {
  EXPECT_EQ(
      render("[{{ '  x  ' | trim }}][{{ 'xxhixx' | trim('x') }}] {{ 'hello world foo' | title }} "
             "{{ \"o'neil\" | title }} {{ 'HELLO wORLD' | capitalize }} {{ 'ß' | upper }}"),
      "[x][hi] Hello World Foo O'neil Hello world SS");
  EXPECT_EQ(render("{{ 'hello' | replace('l', 'L', 1) }} {{ xs | length }} {{ s | length }} "
                   "{{ d | count }} {{ xs | first }} {{ 'ab' | last }} {{ [] | first }}|",
                   ctx()),
            "heLlo 3 5 2 1 b |");
  EXPECT_EQ(render("{{ xs | join(', ') }} {{ [1, none, 'a'] | join }} "
                   "{{ [{'a': 1}, {'a': 2}] | join(',', attribute='a') }} {{ 'abc' | list }}",
                   ctx()),
            "1, 2, 3 1Nonea 1,2 ['a', 'b', 'c']");
  EXPECT_EQ(render("{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 3.9 | int }} "
                   "{{ '0x1A' | int(base=16) }} {{ '3.5' | float }} {{ 'x' | float }} {{ 5 | "
                   "string ~ 'a' }}"),
            "42 4 0 3 26 3.5 0.0 5a");
  EXPECT_EQ(render("{{ -3 | abs }} {{ 2.675 | round(2) }} {{ 2.5 | round }} {{ 3 | round }} "
                   "{{ 2.1 | round(method='ceil') }}"),
            "3 2.67 2.0 3 3.0");
  EXPECT_EQ(
      render("{{ \"text\\nline2\\n\\nline4\" | indent(2) }}|{{ \"a\\nb\" | indent(2, true) }}"),
      "text\n  line2\n\n  line4|  a\n  b");
  EXPECT_EQ(
      render(
          "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} "
          "{{ [{'n': 2}, {'n': 1}] | sort(attribute='n') }} {{ ['a', 'A', 'b'] | unique | list }} "
          "{{ xs | reverse | list }} {{ 'abc' | reverse }} {{ d | dictsort }}",
          ctx()),
      "[1, 2, 3] ['A', 'b', 'c'] [{'n': 1}, {'n': 2}] ['a', 'b'] [3, 2, 1] cba "
      "[('a', 2), ('b', 1)]");
  EXPECT_EQ(
      render("{{ [1, 5, 3] | max }} {{ [1, 5, 3] | min }} {{ [1, 5, 3] | sum }} "
             "{{ xs | batch(2) | list }} {{ 'a b' | wordcount }} {{ '%s-%d' | format('a', 3) }}",
             ctx()),
      "5 1 9 [[1, 2], [3]] 2 a-3");
  EXPECT_EQ(render("{{ '<a href=\"x\">&' | e }} {{ ('<' | safe) + '<' }} {{ '<b>' | safe }}"),
            "&lt;a href=&#34;x&#34;&gt;&amp; <&lt; <b>");
  EXPECT_EQ(render("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}", ctx()), "b=1;a=2;");
}

TEST(ChatTemplateTest, SelectRejectAndMap) {
  const Json c = Json::parse(R"({"ms": [{"role": "user", "c": "a"}, {"role": "assistant", "c": "b"},
                                        {"role": "user", "c": "c"}]})");
  EXPECT_EQ(render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }} "
                   "{{ ms | rejectattr('role', 'eq', 'user') | list | length }} "
                   "{{ [1, 2, 3] | select('odd') | list }} {{ [1, 2, 3] | reject('odd') | list }} "
                   "{{ [0, 1, '', 'a'] | select | list }} {{ [1, 2, 3] | select('>', 1) | list }} "
                   "{{ [-1, 2] | map('abs') | map('string') | join('-') }} "
                   "{{ [{'r': 'u'}, {}] | map(attribute='r', default='D') | list }}",
                   c),
            "['a', 'c'] 1 [1, 3] [2] [1, 'a'] [2, 3] 1-2 ['u', 'D']");
  // select and map return generators: one pass, no len(), no printing.
  EXPECT_NE(error_of("{{ xs | select('odd') | length }}", ctx()).find("has no len()"),
            std::string::npos);
  EXPECT_NE(error_of("{{ xs | map('string') }}", ctx()).find("generator"), std::string::npos);
}

TEST(ChatTemplateTest, TojsonAsTransformersDefinesIt) {
  EXPECT_EQ(
      render("{{ d | tojson }} {{ d | tojson(indent=2) }} {{ [] | tojson(indent=2) }}", ctx()),
      "{\"b\": 1, \"a\": 2} {\n  \"b\": 1,\n  \"a\": 2\n} []");
  EXPECT_EQ(
      render(R"({{ "é\u2028\n\"\\\x7f\x01" | tojson }} {{ "é" | tojson(ensure_ascii=true) }})"),
      "\"é\u2028\\n\\\"\\\\\x7f\\u0001\" \"\\u00e9\"");
  EXPECT_EQ(render("{{ 1.0 | tojson }} {{ [1, [2, {'a': none}]] | tojson(indent=2) }}"),
            "1.0 [\n  1,\n  [\n    2,\n    {\n      \"a\": null\n    }\n  ]\n]");
  EXPECT_EQ(
      render("{{ d | tojson(sort_keys=true) }} {{ d | tojson(separators=(',', ':')) }}", ctx()),
      "{\"a\": 2, \"b\": 1} {\"b\":1,\"a\":2}");
  EXPECT_NE(
      error_of("{{ nope | tojson }}").find("Object of type Undefined is not JSON serializable"),
      std::string::npos);
}

TEST(ChatTemplateTest, StringDictAndListMethods) {
  EXPECT_EQ(
      render("{{ '  a b  '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} "
             "{{ 'a,b,c'.rsplit(',', 1) }} {{ ''.split(',') }} {{ 'a\\nb\\r\\nc'.splitlines() }}"),
      "['a', 'b'] ['a', 'b', '', 'c'] ['a', 'b,c'] ['a,b', 'c'] [''] ['a', 'b', 'c']");
  EXPECT_EQ(
      render("[{{ ' xx '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\nab\\n'.lstrip('\\n') }}|"
             "{{ 'ab\\n\\n'.rstrip('\\n') }}]"),
      "[xx|a|ab\n|ab]");
  EXPECT_EQ(
      render(
          "{{ 'ab'.startswith(('x', 'a')) }} {{ 'ab'.endswith('b') }} {{ 'ab'.find('b') }} "
          "{{ 'aaa'.count('a') }} {{ 'ab'.replace('a', 'z') }} {{ '-'.join(['a', 'b']) }} "
          "{{ 'ab'.upper() }} {{ 'AB'.lower() }} {{ \"o'neil\".title() }} {{ 'hi'.capitalize() }} "
          "{{ '1'.isdigit() }} {{ 'a b'.partition(' ') }} {{ '{0}-{1}'.format('a', 'b') }}"),
      "True True 1 3 zb a-b AB ab O'Neil Hi True ('a', ' ', 'b') a-b");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %} {{ d.keys() | list }} "
                   "{{ d.values() | list }} {{ xs.index(2) }} {{ xs.count(3) }}",
                   ctx()),
            "b1a2 ['b', 'a'] [1, 2] 1 1");
  EXPECT_NE(error_of("{% set x = xs.append(4) %}", ctx())
                .find("access to attribute 'append' of 'list' object is unsafe."),
            std::string::npos);
}

TEST(ChatTemplateTest, ForLoops) {
  EXPECT_EQ(render("{% for x in xs if x > 1 %}{{ loop.index }}/{{ loop.length }}/{{ loop.first }}/"
                   "{{ loop.last }}/{{ loop.revindex }}/{{ loop.previtem }}/{{ loop.nextitem }};"
                   "{% else %}empty{% endfor %}",
                   ctx()),
            "1/2/True/False/2//3;2/2/False/True/1/2/;");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}"
                   "{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
                   ctx()),
            "1");
  EXPECT_EQ(render("{% for a, b in [(1, 2), (3, 4)] %}{{ a }}{{ b }}{% endfor %}"
                   "{% for (a, b) in [[5, 6]] %}{{ a }}{{ b }}{% endfor %}"),
            "123456");
  EXPECT_EQ(render("{% for x in [1, 2] %}{% for y in [3, 4] %}{{ loop.index }}{{ x }}{% endfor %}"
                   "{{ loop.index }}{% endfor %}"),
            "1121112222");
  EXPECT_EQ(render("{% for m in xs %}{{ loop.cycle('a', 'b') }}{% if loop.changed(m > 1) %}C"
                   "{% endif %}{% endfor %}",
                   ctx()),
            "aCbCa");
  EXPECT_EQ(render("{% for x in 'héllo'[:2] %}[{{ x }}]{% endfor %}"), "[h][é]");
  EXPECT_NE(error_of("{% for a, b in [(1, 2, 3)] %}{% endfor %}")
                .find("too many values to unpack (expected 2)"),
            std::string::npos);
  EXPECT_NE(error_of("{% for x in none %}{% endfor %}").find("'NoneType' object is not iterable"),
            std::string::npos);
}

TEST(ChatTemplateTest, ScopesAsJinja2) {
  // A set in a loop body lasts one iteration and never leaks; if has no scope of its own.
  EXPECT_EQ(render("{% for i in [1, 2] %}{% if i == 1 %}{% set x = 'a' %}{% endif %}[{{ x }}]"
                   "{% endfor %}"),
            "[a][]");
  EXPECT_EQ(render("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}"
                   "{% for i in [1] %}{% set x = 3 %}{{ x }}{% endfor %}{{ x }}"),
            "232");
  EXPECT_EQ(render("{% set ns = namespace(items=[], n=0) %}{% for x in xs %}"
                   "{% set ns.items = ns.items + [x * 2] %}{% set ns.n = ns.n + 1 %}{% endfor %}"
                   "{{ ns.items }} {{ ns.n }}",
                   ctx()),
            "[2, 4, 6] 3");
  EXPECT_EQ(render("{% set x %}  inner {{ 1 }} {% endset %}[{{ x }}]{% set c | upper %}abc{% "
                   "endset %}{{ c }}"),
            "[  inner 1 ]ABC");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}"), "12(1, 2)");
  EXPECT_EQ(render("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"), "3[]");
  EXPECT_NE(error_of("{% set x = 1 %}{% set x.y = 2 %}")
                .find("cannot assign attribute on non-namespace object"),
            std::string::npos);
}

TEST(ChatTemplateTest, MacrosAndCallBlocks) {
  EXPECT_EQ(render("{% macro f(a, b='B') %}[{{ a }}{{ b }}{{ varargs }}{{ kwargs }}]{% endmacro %}"
                   "{{ f(1) }}{{ f(1, 2) }}{{ f(b=3, a=4) }}"),
            "[1B(){}][12(){}][43(){}]");
  EXPECT_EQ(render("{% macro f(a) %}[{{ a }}{{ varargs }}]{% endmacro %}{{ f(1, 2, 3) }}"),
            "[1(2, 3)]");
  EXPECT_EQ(render("{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ m('q') }}"), "qq!");
  EXPECT_EQ(render("{% macro m() %}{{ y }}{% endmacro %}{% set y = 1 %}{{ m() }}"), "1");
  EXPECT_EQ(
      render(
          "{% macro f(x) %}<{{ caller() }}{{ x }}>{% endmacro %}{% call f(1) %}body{% endcall %}"),
      "<body1>");
  EXPECT_EQ(render("{% filter upper %}abc {{ 'd' }}{% endfilter %}"), "ABC D");
  EXPECT_NE(error_of("{% macro m() %}x{% endmacro %}{{ m(1) }}")
                .find("macro 'm' takes not more than 0 argument(s)"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro m(a) %}{% endmacro %}{{ m(a=1, b=2) }}")
                .find("macro 'm' takes no keyword argument 'b'"),
            std::string::npos);
}

TEST(ChatTemplateTest, Globals) {
  EXPECT_EQ(render("{{ range(5) | list }} {{ range(2, 8, 2) | list }} {{ range(5, 0, -2) | list }} "
                   "{{ dict(a=1, b='x') }} {{ namespace(a=1).a }}"),
            "[0, 1, 2, 3, 4] [2, 4, 6] [5, 3, 1] {'a': 1, 'b': 'x'} 1");
  const std::string today = render("{{ strftime_now('%Y-%m-%d') }}");
  EXPECT_TRUE(std::regex_match(today, std::regex(R"(\d{4}-\d{2}-\d{2})"))) << today;
  // The context overrides a global.
  EXPECT_EQ(render("{{ range }}", Json{{"range", "mine"}}), "mine");
}

TEST(ChatTemplateTest, RaiseExceptionCarriesItsMessage) {
  const std::string msg = error_of(
      "line one\n{% if true %}{{ raise_exception('Roles must alternate ' ~ 2) }}{% endif %}");
  EXPECT_NE(msg.find("chat template 'test' raised an exception at line 2: Roles must alternate 2"),
            std::string::npos)
      << msg;
}

TEST(ChatTemplateTest, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(
      error_of("ok\n{% if true %}x"),
      "chat template 'test', line 2 column 15: Unexpected end of template. Jinja was looking "
      "for the following tags: 'elif' or 'else' or 'endif'. The innermost block that needs to "
      "be closed is 'if'.");
  EXPECT_EQ(error_of("a\nb {{ x | nosuchfilter }}"),
            "chat template 'test', line 2 column 10: No filter named 'nosuchfilter'.");
  EXPECT_EQ(error_of("{{ x is nosuchtest }}"),
            "chat template 'test', line 1 column 9: No test named 'nosuchtest'.");
  EXPECT_EQ(error_of("{{ foo( }}"),
            "chat template 'test', line 1 column 9: unexpected '}', expected ')'");
  EXPECT_EQ(error_of("{% if xs %}{% elif %}{% endif %}"),
            "chat template 'test', line 1 column 20: Expected an expression, got 'end of statement "
            "block'");
  EXPECT_EQ(
      error_of("{% for x in xs %}{% endif %}"),
      "chat template 'test', line 1 column 21: Encountered unknown tag 'endif'. Jinja was looking "
      "for the following tags: 'endfor' or 'else'. The innermost block that needs to be closed "
      "is 'for'.");
  EXPECT_EQ(error_of("{# never closed"),
            "chat template 'test', line 1 column 3: Missing end of comment tag");
  EXPECT_EQ(error_of("{% break %}"),
            "chat template 'test', line 1 column 4: 'break' outside of a for loop");
  EXPECT_EQ(error_of("{% include 'other.jinja' %}"),
            "chat template 'test', line 1 column 4: 'include' is not supported: a chat template "
            "renders alone");
  EXPECT_EQ(error_of("{{ 'a' | pprint }}"),
            "chat template 'test', line 1 column 10: the filter 'pprint' is not supported");
  EXPECT_NE(error_of("\xff").find("not well-formed UTF-8"), std::string::npos);
}

TEST(ChatTemplateTest, UnknownFilterInsideIfFailsOnlyWhenEvaluated) {
  // jinja2 defers the check inside if statements ("soft" frames) to run time.
  EXPECT_EQ(render("{% if false %}{{ x | nosuchfilter }}{% endif %}ok"), "ok");
  EXPECT_NE(error_of("{% if true %}{{ x | nosuchfilter }}{% endif %}")
                .find("No filter named 'nosuchfilter' found."),
            std::string::npos);
}

TEST(ChatTemplateTest, RuntimeErrorsNameTheLine) {
  EXPECT_EQ(error_of("a\nb\n{{ 1 }}{{ nope.x }}"),
            "chat template 'test', line 3 column 15: 'nope' is undefined");
}

TEST(ChatTemplateTest, GenerationSpansAreBytesOfTheOutput) {
  const ChatTemplate t(
      "{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' %}{% generation %}"
      "{{ m.content }}!{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
      "gen");
  EXPECT_TRUE(t.has_generation_blocks());
  EXPECT_FALSE(ChatTemplate("{{ 1 }}", "plain").has_generation_blocks());
  const Json c = Json::parse(R"({"messages": [{"role": "user", "content": "héllo"},
      {"role": "assistant", "content": "wörld"}, {"role": "user", "content": "x"},
      {"role": "assistant", "content": ""}]})");
  std::vector<std::pair<size_t, size_t>> spans;
  const std::string out = t.render(c, &spans);
  EXPECT_EQ(out, "<user>héllo<assistant>wörld!<user>x<assistant>!");
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(out.substr(spans[0].first, spans[0].second - spans[0].first), "wörld!");
  EXPECT_EQ(out.substr(spans[1].first, spans[1].second - spans[1].first), "!");
  EXPECT_EQ(spans[1].second, out.size());
  // transformers' tracker records nothing for a block before anything else was output.
  const ChatTemplate first(
      "{% generation %}a{% endgeneration %}{% generation %}b{% endgeneration %}", "first");
  EXPECT_EQ(first.render(Json::object(), &spans), "ab");
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0], std::make_pair(size_t(1), size_t(2)));
}

TEST(ChatTemplateTest, ContextKeyOrderIsKept) {
  const Json ordered = Json::parse(R"({"tool": {"name": "f", "description": "d", "a": 1}})");
  EXPECT_EQ(render("{{ tool | tojson }} {{ tool.keys() | list }}", ordered),
            "{\"name\": \"f\", \"description\": \"d\", \"a\": 1} ['name', 'description', 'a']");
  // A nlohmann::json converts, with its keys sorted.
  const nlohmann::json sorted = nlohmann::json::parse(R"({"tool": {"name": "f", "a": 1}})");
  EXPECT_EQ(ChatTemplate("{{ tool | tojson }}", "t").render(sorted), "{\"a\": 1, \"name\": \"f\"}");
}

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/tests/data/chat_templates/" + name +
                   ".jinja");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The families' real templates on one conversation, as transformers renders them (with
// add_generation_prompt=True).
TEST(ChatTemplateTest, RealTemplatesMatchTransformers) {
  const Json messages =
      Json::parse(R"([{"role": "system", "content": "You are a concise assistant."},
      {"role": "user", "content": "What is the capital of France?"},
      {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And of Italy?"}])");
  auto context = [&](Json tokens) {
    Json c = {{"messages", messages},
              {"tools", nullptr},
              {"documents", nullptr},
              {"add_generation_prompt", true}};
    c.update(tokens);
    return c;
  };
  const std::string qwen =
      "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n<|im_start|>user\nWhat is the "
      "capital of "
      "France?<|im_end|>\n<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>user\nAnd "
      "of Italy?<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(ChatTemplate(read_template("qwen2.5"), "qwen2.5")
                .render(context({{"eos_token", "<|im_end|>"}})),
            qwen);
  EXPECT_EQ(
      ChatTemplate(read_template("qwen3"), "qwen3").render(context({{"eos_token", "<|im_end|>"}})),
      qwen);
  EXPECT_EQ(
      ChatTemplate(read_template("llama-3.1"), "llama-3.1")
          .render(context({{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}})),
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
      "December 2023\nToday Date: 26 Jul 2024\n\nYou are a concise assistant.<|eot_id|>"
      "<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>"
      "<|start_header_id|>assistant<|end_header_id|>\n\nParis.<|eot_id|><|start_header_id|>user"
      "<|end_header_id|>\n\nAnd of Italy?<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
      "\n\n");
  EXPECT_EQ(
      ChatTemplate(read_template("gemma3"), "gemma3")
          .render(context({{"bos_token", "<bos>"}, {"eos_token", "<eos>"}})),
      "<bos><start_of_turn>user\nYou are a concise assistant.\n\nWhat is the capital of France?"
      "<end_of_turn>\n<start_of_turn>model\nParis.<end_of_turn>\n<start_of_turn>user\nAnd of "
      "Italy?<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(ChatTemplate(read_template("mistral-v0.3"), "mistral-v0.3")
                .render(context({{"bos_token", "<s>"}, {"eos_token", "</s>"}})),
            "<s>[INST] What is the capital of France?[/INST] Paris.</s>[INST] You are a concise "
            "assistant.\n\nAnd of Italy?[/INST]");

  const ChatTemplate smollm3(read_template("smollm3"), "smollm3");
  ASSERT_TRUE(smollm3.has_generation_blocks());
  const Json smol = {
      {"messages", Json::parse(R"([{"role": "system", "content": "Answer briefly./system_override"},
      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Héllo!"},
      {"role": "user", "content": "Bye"}])")},
      {"tools", nullptr},
      {"documents", nullptr},
      {"add_generation_prompt", true},
      {"enable_thinking", false},
      {"eos_token", "<|im_end|>"}};
  std::vector<std::pair<size_t, size_t>> spans;
  EXPECT_EQ(smollm3.render(smol, &spans),
            "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\nHéllo!<|im_end|>\n<|im_start|>user\nBye"
            "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n");
  EXPECT_EQ(spans, (std::vector<std::pair<size_t, size_t>>{{75, 133}}));
  // Gemma refuses a conversation whose roles do not alternate, with its own message.
  Json bad = context({{"bos_token", "<bos>"}});
  bad["messages"] =
      Json::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  try {
    ChatTemplate(read_template("gemma3"), "gemma3").render(bad);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "Conversation roles must alternate user/assistant/user/assistant/..."),
              std::string::npos);
  }
}

}  // namespace
}  // namespace strata::data
