// What a monitor records at one point of a run: named scalar values (TensorBoard's tags, e.g.
// "Train/Samples/train_loss") at one step of its x axis.
#pragma once

#include <string>
#include <vector>

namespace strata::monitor {

struct Scalar {
  std::string tag;
  double value = 0.0;
};
using Scalars = std::vector<Scalar>;

}  // namespace strata::monitor
