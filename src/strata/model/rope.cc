#include "strata/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "strata/core/check.h"

namespace strata {

namespace {

// Llama 3.1's scaling: wavelengths longer than the trained context / low_freq_factor are
// interpolated by `factor`, shorter than context / high_freq_factor kept, and the band between
// blended smoothly.
void llama3(ops::Rope& r, const RopeScaling& s) {
  const float context = float(s.original_max_positions);
  const float low_wavelen = context / s.low_freq_factor,
              high_wavelen = context / s.high_freq_factor;
  for (int i = 0; i < r.rotary_dim / 2; ++i) {
    const float f = r.inv_freq[i], wavelen = 2.0f * std::numbers::pi_v<float> / f;
    float scaled = wavelen > low_wavelen ? f / s.factor : f;
    if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
      const float smooth =
          (context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      scaled = (1.0f - smooth) * scaled / s.factor + smooth * scaled;
    }
    r.inv_freq[i] = scaled;
  }
}

// YaRN: frequencies that turn fewer than beta_slow times over the trained context are
// interpolated by `factor`, those turning more than beta_fast times kept, with a linear ramp over
// the dimensions between; cos and sin are multiplied by the attention factor.
void yarn(ops::Rope& r, const RopeScaling& s, float theta) {
  const double dim = r.rotary_dim, base = theta, context = s.original_max_positions;
  auto correction_dim = [&](double rotations) {
    return dim * std::log(context / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), dim - 1.0);
  if (low == high) high += 0.001;
  for (int i = 0; i < r.rotary_dim / 2; ++i) {
    const float ramp = std::clamp(float((double(i) - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation = 1.0f - ramp;  // the share kept unscaled
    const float f = r.inv_freq[i];
    r.inv_freq[i] = f / s.factor * (1.0f - extrapolation) + f * extrapolation;
  }
  r.attention_factor = s.attention_factor > 0.0f
                           ? s.attention_factor
                           : (s.factor <= 1.0f ? 1.0f : 0.1f * std::log(s.factor) + 1.0f);
}

}  // namespace

ops::Rope rope_table(const ModelConfig& m) {
  ops::Rope r = ops::rope_default(m.hd(), m.rope_theta);
  const RopeScaling& s = m.rope_scaling;
  if (s.type == "linear") {
    for (int i = 0; i < r.rotary_dim / 2; ++i) r.inv_freq[i] /= s.factor;
  } else if (s.type == "llama3") {
    llama3(r, s);
  } else if (s.type == "yarn") {
    yarn(r, s, m.rope_theta);
  } else {
    STRATA_CHECK(s.type == "none", "unknown RoPE scaling type ", s.type);
  }
  return r;
}

}  // namespace strata
