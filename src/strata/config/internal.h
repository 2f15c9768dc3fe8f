// Internals of the config parser shared by the config_*.cc files: the schema (every block's keys),
// the strict block reader, and the parsers of each group of blocks. Not for use outside config*.
#pragma once

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/text.h"

namespace strata::config_detail {

using json = nlohmann::json;
using Keys = std::vector<std::string>;

// ---- schema: the valid keys of every block, by path ("" is the top level) ----

struct BlockSchema {
  std::string path;
  const Keys* keys;
};
const std::vector<BlockSchema>& schema();
const Keys& keys_of(std::string_view path);  // the block at `path` must exist in schema()

// ---- messages ----

// lower, edit_distance and nearest: core/text.h.
using strata::edit_distance;
using strata::lower;
using strata::nearest;
// A value as the user wrote it (JSON), shortened for a message.
std::string show(const json& v);
std::string join_path(std::string_view parent, std::string_view key);
// ", "-joined list, each element quoted when `quote`.
std::string list(const Keys& items, bool quote);
// The message for key `key` of the block at `path`, which allows `valid`: names a DeepSpeed key
// strata does not implement as such, a key that belongs to another block by its full path, else
// the nearest valid key.
std::string unknown_key_message(std::string_view path, std::string_view key, const Keys& valid);

// ---- all of a config's errors in one run ----

// The errors found so far. parse_config reads every block into one list and throws a single
// InputError naming each; a check that depends on an earlier value stops its group of blocks.
class ConfigErrors {
 public:
  void add(std::string message);  // a repeated message is kept once
  bool empty() const { return messages_.empty(); }
  const std::vector<std::string>& messages() const { return messages_; }
  // Throws the InputError: the one message as is, or "the config has N errors:" and a line each.
  [[noreturn]] void raise() const;
  // Runs `parse`; an InputError it throws joins the list.
  template <typename F>
  void collect(F&& parse) {
    try {
      parse();
    } catch (const InputError& e) {
      add(e.what());
    }
  }

 private:
  std::vector<std::string> messages_;
};

// ---- the block reader ----

// One JSON object read as a config block. The constructor rejects a non-object and any key outside
// `keys`; the getters leave `out` untouched (the default) when the key is absent, check the type
// and the range, and return whether the key was given. In DeepSpeed's pydantic blocks (zero,
// fp16, bf16, monitors) the string "auto" means "use the default" (`auto_means_default`).
// With `errors`, a bad key or value joins that list (a getter then returns false, leaving the
// default) and reading goes on; without, it throws the InputError at once. Children share the
// list of their parent.
class Block {
 public:
  Block(const json* j, std::string path, const Keys& keys, bool auto_means_default = false,
        ConfigErrors* errors = nullptr);

  const std::string& path() const { return path_; }
  bool present() const { return j_ != nullptr; }
  // Keys whose JSON null means "not given" (DeepSpeed's Optional fields).
  Block& nullable(std::initializer_list<std::string_view> keys);
  bool has(
      std::string_view key) const;  // given (not absent, not "auto"/null where they mean unset)
  bool is_null(std::string_view key) const;  // given as JSON null
  const json& at(std::string_view key) const;
  std::string key_path(std::string_view key) const { return join_path(path_, key); }

  bool get_bool(std::string_view key, bool& out) const;
  bool get_int(std::string_view key, int64_t& out, int64_t lo, int64_t hi = INT64_MAX) const;
  bool get_int(std::string_view key, int& out, int lo, int hi = INT_MAX) const;
  bool get_uint64(std::string_view key, uint64_t& out) const;
  // A finite number in [lo, hi] (or (lo, hi] when `lo_open`).
  bool get_number(std::string_view key, double& out, double lo, double hi,
                  bool lo_open = false) const;
  bool get_number(std::string_view key, float& out, double lo, double hi,
                  bool lo_open = false) const;
  bool get_string(std::string_view key, std::string& out) const;
  // One of `allowed`; stores the allowed spelling (matched case-insensitively when asked).
  bool get_choice(std::string_view key, std::string& out, const Keys& allowed,
                  bool case_insensitive = false) const;
  // The nested block at `key` (absent: an empty block, every getter leaves its default).
  Block child(std::string_view key, const Keys& keys, bool auto_means_default = false) const;

  // "<path> must be <what>, got <value>" for `key`.
  [[noreturn]] void fail(std::string_view key, std::string_view what) const;
  // The same message, added to the error list (thrown without one); returns false.
  bool bad(std::string_view key, std::string_view what) const;
  // `message` added to the error list (thrown without one).
  void report(const std::string& message) const;
  ConfigErrors* errors() const { return errors_; }

 private:
  const json* value(std::string_view key) const;  // nullptr when not given
  std::string fail_message(std::string_view key, std::string_view what) const;

  const json* j_;
  std::string path_;
  bool auto_means_default_;
  ConfigErrors* errors_;
  std::vector<std::string> nullable_;
};

// ---- the parsers, one per group of blocks; each fills its part of `c` from the top level ----

void parse_batch_and_top(const Block& top, Config& c);     // batch keys, top-level scalars
void parse_precision(const Block& top, Config& c);         // fp16, bf16 / bfloat16, data_types
void parse_optimizer(const Block& top, Config& c);         // optimizer
void parse_scheduler(const Block& top, Config& c);         // scheduler (after the optimizer)
void parse_zero(const Block& top, Config& c);              // zero_optimization
void parse_deepspeed_extras(const Block& top, Config& c);  // flops_profiler, comms_logger, aio,
                                                           // data_efficiency, torch_autocast, ...
void parse_runtime_blocks(const Block& top, Config& c);    // activation ckpt, checkpoint,
                                                           // elasticity, monitors
void parse_model(const Block& top, Config& c);             // model (finalized)
void parse_layout_blocks(const Block& top, Config& c);     // parallelism, data, train
// Checks that span blocks (ZeRO with the optimizer, precision with data_types,
// activation_checkpointing.number_checkpoints with model.layers, ...).
void check_cross_block(Config& c);
// Throws the InputError for a parallelism.tensor that cannot split the model's heads, KV heads
// or MLP, or (parallelism.sequence_parallel) a micro-batch of `micro_batch` sequences' token rows
// (0: not known yet, not checked); it lists the tensor sizes that pass every rule.
void check_tensor_split(const Config& c, int64_t micro_batch);
void check_expert_split(const Config& c);

// Throws the InputError of parse_json_strict when `j` nests deeper than kMaxConfigDepth (a tree
// built in code, or a file's tree with --set values inside it).
void check_json_depth(const json& j, std::string_view origin);

// Applies one "--set a.b.c=value" to the tree.
void apply_override(json& root, const std::string& spec);

}  // namespace strata::config_detail
