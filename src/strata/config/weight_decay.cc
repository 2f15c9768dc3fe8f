#include "strata/config/weight_decay.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace strata {

const char* weight_decay_group(ParamRole role) {
  switch (role) {
    case ParamRole::TokenEmbedding:
    case ParamRole::PositionEmbedding:
      return "embedding";
    case ParamRole::QkvB:
    case ParamRole::ProjB:
    case ParamRole::FcB:
    case ParamRole::Fc2B:
      return "bias";
    case ParamRole::Norm1W:
    case ParamRole::Norm1B:
    case ParamRole::Norm2W:
    case ParamRole::Norm2B:
    case ParamRole::FinalNormW:
    case ParamRole::FinalNormB:
    case ParamRole::QNormW:
    case ParamRole::KNormW:
    case ParamRole::PostAttnNormW:
    case ParamRole::PostMlpNormW:
      return "norm";
    case ParamRole::QkvW:
    case ParamRole::ProjW:
    case ParamRole::FcW:
    case ParamRole::Fc2W:
    case ParamRole::OutputW:
    case ParamRole::RouterW:
    case ParamRole::ExpertGateUpW:
    case ParamRole::ExpertDownW:
    case ParamRole::SharedFcW:
    case ParamRole::SharedFc2W:
    case ParamRole::SharedGateW:
      return "weight";
  }
  return "weight";
}

bool weight_decay_applies(const OptimizerConfig& o, ParamRole role) {
  const std::string g = weight_decay_group(role);
  return std::find(o.weight_decay_exclude.begin(), o.weight_decay_exclude.end(), g) ==
         o.weight_decay_exclude.end();
}

void set_weight_decay(const OptimizerConfig& o, ModelSpec& spec) {
  for (ParamSpec& p : spec.params) p.decay = weight_decay_applies(o, p.role);
}

namespace {

std::string count(int64_t n) {
  char b[32];
  if (n >= 1000000) {
    std::snprintf(b, sizeof b, "%.2fM", double(n) / 1e6);
  } else if (n >= 1000) {
    std::snprintf(b, sizeof b, "%.1fK", double(n) / 1e3);
  } else {
    std::snprintf(b, sizeof b, "%lld", static_cast<long long>(n));
  }
  return b;
}

std::string join(const std::vector<std::string>& parts) {
  std::string r;
  for (size_t i = 0; i < parts.size(); ++i) {
    r += i == 0 ? "" : i + 1 == parts.size() ? " and " : ", ";
    r += parts[i];
  }
  return r;
}

}  // namespace

std::string weight_decay_summary(const OptimizerConfig& o, const ModelSpec& spec) {
  if (o.weight_decay == 0.0f) return "";
  // In a fixed order, each group named once ("norm gains": a LayerNorm's bias counts with it).
  const char* const kGroups[] = {"weight", "embedding", "bias", "norm"};
  const char* const kNames[] = {"the attention, MLP and output matrices", "the embeddings",
                                "biases", "norm gains"};
  int64_t on = 0, off = 0;
  std::vector<std::string> on_names, off_names;
  for (size_t g = 0; g < 4; ++g) {
    int64_t n = 0;
    bool decays = true;
    for (const ParamSpec& p : spec.params) {
      if (weight_decay_group(p.role) != std::string(kGroups[g])) continue;
      int64_t e = 1;
      for (int64_t d : p.global_shape) e *= d;
      n += e;
      decays = weight_decay_applies(o, p.role);
    }
    if (n == 0) continue;
    (decays ? on : off) += n;
    (decays ? on_names : off_names).push_back(kNames[g]);
  }
  char wd[32];
  std::snprintf(wd, sizeof wd, "%g", double(o.weight_decay));
  std::string r = std::string("weight decay ") + wd + " on " + count(on) + " parameters (" +
                  join(on_names) + ")";
  r += off == 0 ? ", on every parameter" : ", not on " + count(off) + " (" + join(off_names) + ")";
  return r + "; optimizer.weight_decay_exclude chooses";
}

}  // namespace strata
