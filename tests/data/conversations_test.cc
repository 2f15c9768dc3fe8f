// Conversations to tokens and a loss mask (data/conversations.h): which text of a rendered
// conversation is trained, with and without {% generation %} blocks and for templates that render
// earlier turns differently; the files `data prepare --jsonl` writes; its errors.
#include "strata/data/conversations.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/data/jinja.h"
#include "strata/data/token_dataset.h"
#include "tests/data/data_test_util.h"
#include "tests/data/hf_test_tokenizer.h"

namespace strata::data {
namespace {

using ojson = nlohmann::ordered_json;
using test_util::TempDirTest;
using test_util::write_text;

// ChatML, as Qwen2.5 writes it.
const char* kChatml =
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Qwen3's habit: the last assistant turn opens with an (empty) think block, earlier ones do not.
const char* kThinkLast =
    "{% for m in messages %}{% if m.role == 'assistant' and loop.last %}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Mistral's habit: the system prompt goes into the last user turn.
const char* kSystemLast =
    "{% set sys = messages[0].content if messages[0].role == 'system' else '' %}"
    "{% set ns = namespace(last=0) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{{ bos_token }}"
    "{% for m in messages %}{% if m.role == 'user' %}{{ '[INST] ' }}"
    "{% if loop.index0 == ns.last and sys %}{{ sys + '\\n\\n' }}{% endif %}"
    "{{ m.content + '[/INST]' }}{% elif m.role == 'assistant' %}{{ ' ' + m.content + eos_token }}"
    "{% endif %}{% endfor %}";

ojson conversation() {
  return ojson::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"}])");
}

std::vector<std::string> trained_text(const RenderedConversation& r) {
  std::vector<std::string> out;
  for (const auto& [b, e] : r.trained) out.push_back(r.text.substr(b, e - b));
  return out;
}

TEST(Conversations, AssistantTurnsThroughTheirEndOfTurn) {
  const ChatTemplate t(kChatml, "chatml");
  const RenderedConversation r =
      render_conversation(t, ojson::object(), conversation(), false, "x");
  EXPECT_EQ(r.text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n");
  EXPECT_EQ(trained_text(r), (std::vector<std::string>{"Hello!<|im_end|>\n", "4<|im_end|>\n"}));
  const RenderedConversation all =
      render_conversation(t, ojson::object(), conversation(), true, "x");
  EXPECT_EQ(trained_text(all), std::vector<std::string>{all.text});
}

TEST(Conversations, TurnsTheTemplateRendersDifferentlyAreFoundInOrder) {
  const ChatTemplate think(kThinkLast, "think");
  const RenderedConversation r =
      render_conversation(think, ojson::object(), conversation(), false, "x");
  EXPECT_EQ(trained_text(r), (std::vector<std::string>{"Hello!<|im_end|>\n",
                                                       "<think>\n\n</think>\n\n4<|im_end|>\n"}));
  const ChatTemplate mistral(kSystemLast, "mistral");
  const ojson special = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  const RenderedConversation m = render_conversation(mistral, special, conversation(), false, "x");
  EXPECT_EQ(m.text, "<s>[INST] Hi[/INST] Hello!</s>[INST] Be brief.\n\n2+2?[/INST] 4</s>");
  EXPECT_EQ(trained_text(m), (std::vector<std::string>{" Hello!</s>", " 4</s>"}));
}

TEST(Conversations, GenerationBlocksSayWhatIsTrained) {
  const ChatTemplate t(
      "{% for m in messages %}{% if m.role == 'assistant' %}{{ 'A: ' }}{% generation %}"
      "{{ m.content + '.' }}{% endgeneration %}{{ '\\n' }}{% else %}{{ 'U: ' + m.content + '\\n' }}"
      "{% endif %}{% endfor %}",
      "tagged");
  const RenderedConversation r =
      render_conversation(t, ojson::object(), conversation(), false, "x");
  EXPECT_EQ(trained_text(r), (std::vector<std::string>{"Hello!.", "4."}));
}

TEST(Conversations, ATurnTheTemplateDropsIsAnError) {
  const ChatTemplate t(
      "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}{{ m.content + '|' }}"
      "{% endif %}{% endfor %}",
      "drops");
  try {
    render_conversation(t, ojson::object(), conversation(), false, "conv.jsonl:3");
    FAIL() << "found a turn the template does not render";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("conv.jsonl:3: assistant message 2"), std::string::npos)
        << e.what();
  }
}

class PrepareConversations : public TempDirTest {
 protected:
  // A byte-level tokenizer (one token a byte, no merges) with ChatML's tokens, and its config.
  void SetUp() override {
    TempDirTest::SetUp();
    test_util::Builder b;
    start_ = b.add("<|im_start|>");
    end_ = b.add("<|im_end|>");
    std::filesystem::create_directories(path("tok"));
    write_text(path("tok/tokenizer.json"), b.build().dump());
    write_text(
        path("tok/tokenizer_config.json"),
        ojson({{"eos_token", {{"content", "<|im_end|>"}}}, {"chat_template", kChatml}}).dump());
  }
  int start_ = 0, end_ = 0;
};

TEST_F(PrepareConversations, WritesTokensAndTheAssistantsMask) {
  write_text(path("c.jsonl"),
             ojson({{"messages", conversation()}}).dump() + "\n\n" +
                 ojson({{"prompt", "Hey"}, {"completion", "Yo"}}).dump() + "\n" +
                 ojson({{"messages", ojson::parse(R"([{"role":"user","content":"é"},
                        {"role":"assistant","content":"ü"}])")}})
                     .dump() +
                 "\n");
  ConversationOptions o;
  o.tokenizer = path("tok");
  o.val_fraction = 0.34;
  o.seq_len = 256;
  const ConversationResult r = prepare_conversations(path("c.jsonl"), path("out/"), o);
  EXPECT_EQ(r.train_conversations, 2);
  EXPECT_EQ(r.val_conversations, 1);
  EXPECT_EQ(r.template_source, path("tok/tokenizer_config.json"));
  ASSERT_EQ(r.outputs.size(), 6u);
  for (const std::string& f : r.outputs) EXPECT_TRUE(std::filesystem::exists(f)) << f;
  const auto ds = open_dataset(path("out/train"), "megatron");
  ASSERT_TRUE(ds->has_loss_mask());
  ASSERT_EQ(ds->document_starts().size(), 2u);
  std::vector<int32_t> ids = test_util::read_all(*ds);
  std::vector<uint8_t> mask(ids.size());
  ds->read_mask(0, int64_t(ids.size()), mask.data());
  // The trained tokens, as text: the two assistant turns of the first conversation, then the
  // completion of the second.
  std::string trained;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (mask[i] == 0) continue;
    trained += ids[i] == end_ ? std::string("<|im_end|>") : std::string(1, char(ids[i]));
    if (i + 1 == ids.size() || mask[i + 1] == 0) trained += "|";
  }
  EXPECT_EQ(trained, "Hello!<|im_end|>\n|4<|im_end|>\n|Yo<|im_end|>\n|");
  EXPECT_EQ(r.trained_tokens, 8 + 3 + 4);
  EXPECT_EQ(r.windows, 1);
  EXPECT_NEAR(r.packing_efficiency, double(r.train_tokens) / 256.0, 1e-12);  // one window
}

TEST_F(PrepareConversations, BadInputNamesTheLineAndLeavesNothing) {
  ConversationOptions o;
  o.tokenizer = path("tok");
  auto refused = [&](const std::string& jsonl, const std::string& says) {
    write_text(path("bad.jsonl"), jsonl);
    try {
      prepare_conversations(path("bad.jsonl"), path("bad/"), o);
      FAIL() << "accepted: " << jsonl;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    for (const char* f : {"bad/train.bin", "bad/train.idx", "bad/train.lossmask"}) {
      EXPECT_FALSE(std::filesystem::exists(path(f))) << f;
    }
  };
  const std::string good = ojson({{"messages", conversation()}}).dump() + "\n";
  refused(good + "{\"messages\": [\n", "bad.jsonl:2: not valid JSON");
  refused(good + "{\"text\": \"hi\"}\n", "bad.jsonl:2: no \"messages\"");
  refused(good + R"({"messages": [{"content": "hi"}]})" + "\n", "message 0 has no \"role\"");
  o.train_on = "everything";
  refused(good, "--train-on");
  o.train_on = "assistant";
  o.chat_template = path("missing.jinja");
  refused(good, "missing.jinja");
  write_text(path("raise.jinja"), "{{ raise_exception('roles must alternate') }}");
  o.chat_template = path("raise.jinja");
  refused(good, "roles must alternate");
}

}  // namespace
}  // namespace strata::data
