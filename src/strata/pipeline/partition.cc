#include "strata/pipeline/partition.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "strata/core/check.h"

namespace strata::pipeline {

PartitionMethod parse_partition(std::string_view name) {
  if (name == "uniform") return PartitionMethod::Uniform;
  if (name == "parameters") return PartitionMethod::Parameters;
  if (name == "time") return PartitionMethod::Time;
  if (name == "explicit") return PartitionMethod::Explicit;
  STRATA_INPUT_FAIL("parallelism.partition: unknown method '", name,
                    "'; valid: uniform, parameters, time, explicit (a list of blocks per chunk)");
}

const char* partition_name(PartitionMethod m) {
  switch (m) {
    case PartitionMethod::Uniform:
      return "uniform";
    case PartitionMethod::Parameters:
      return "parameters";
    case PartitionMethod::Time:
      return "time";
    case PartitionMethod::Explicit:
      return "explicit";
  }
  return "?";
}

namespace {

// The model's units by role: where each block's units start, and the parameter counts.
struct Layout {
  std::vector<int> block_unit;  // per block: its first unit; [L]: the first unit after the blocks
  std::vector<double> block_params;
  double embedding_params = 0, head_params = 0;
};

Layout layout_of(const ModelSpec& spec) {
  const int L = spec.config.layers;
  Layout out;
  out.block_unit.assign(size_t(L) + 1, -1);
  out.block_params.assign(size_t(L), 0.0);
  for (size_t u = 0; u < spec.units.size(); ++u) {
    const UnitSpec& unit = spec.units[u];
    switch (unit.kind) {
      case UnitKind::Vocab:
        // With tied embeddings the last stage holds a copy of the vocabulary for its logits.
        if (spec.config.tied_embeddings) out.head_params += double(unit.numel);
        [[fallthrough]];
      case UnitKind::Position:
        out.embedding_params += double(unit.numel);
        break;
      case UnitKind::Attention:
      case UnitKind::Mlp:
      case UnitKind::Experts:
        STRATA_CHECK(unit.layer >= 0 && unit.layer < L, "unit ", unit.name, " has layer ",
                     unit.layer);
        if (out.block_unit[size_t(unit.layer)] < 0) out.block_unit[size_t(unit.layer)] = int(u);
        out.block_params[size_t(unit.layer)] += double(unit.numel);
        break;
      case UnitKind::FinalNorm:
        out.block_unit[size_t(L)] = int(u);
        [[fallthrough]];
      case UnitKind::Output:
        out.head_params += double(unit.numel);
        break;
    }
  }
  for (int l = 0; l <= L; ++l) {
    STRATA_CHECK(out.block_unit[size_t(l)] >= 0, "the model spec has no units for block ", l);
  }
  return out;
}

std::vector<int> uniform_blocks(int L, int n) {
  std::vector<int> blocks(size_t(n), L / n);
  std::vector<int> order;  // who gets the remainder: the middle chunks, then the first
  for (int g = 1; g + 1 < n; ++g) order.push_back(g);
  order.push_back(0);
  for (int i = 0; i < L % n; ++i) ++blocks[size_t(order[size_t(i)])];
  return blocks;
}

// Contiguous split of the blocks' costs into n non-empty chunks (first += first_extra, last +=
// last_extra) minimising the largest chunk's cost, then the sum of squares among those.
std::vector<int> balanced_blocks(const std::vector<double>& block, double first_extra,
                                 double last_extra, int n) {
  const int L = int(block.size());
  std::vector<double> prefix(size_t(L) + 1, 0.0);
  std::partial_sum(block.begin(), block.end(), prefix.begin() + 1);
  auto cost = [&](int g, int k, int l) {
    return prefix[size_t(l)] - prefix[size_t(k)] + (g == 0 ? first_extra : 0.0) +
           (g == n - 1 ? last_extra : 0.0);
  };
  constexpr double inf = std::numeric_limits<double>::infinity();
  auto table = [&] {
    return std::vector<std::vector<double>>(size_t(n) + 1, std::vector<double>(size_t(L) + 1, inf));
  };
  // worst[j][l]: the least possible largest cost of the first l blocks in j chunks.
  auto worst = table();
  worst[0][0] = 0;
  for (int j = 1; j <= n; ++j) {
    for (int l = j; l <= L; ++l) {
      for (int k = j - 1; k < l; ++k) {
        worst[size_t(j)][size_t(l)] =
            std::min(worst[size_t(j)][size_t(l)],
                     std::max(worst[size_t(j - 1)][size_t(k)], cost(j - 1, k, l)));
      }
    }
  }
  const double bound = worst[size_t(n)][size_t(L)] * (1 + 1e-12);
  auto squares = table();
  std::vector<std::vector<int>> cut(size_t(n) + 1, std::vector<int>(size_t(L) + 1, -1));
  squares[0][0] = 0;
  for (int j = 1; j <= n; ++j) {
    for (int l = j; l <= L; ++l) {
      for (int k = j - 1; k < l; ++k) {
        const double c = cost(j - 1, k, l);
        const double total = squares[size_t(j - 1)][size_t(k)] + c * c;
        if (c <= bound && total < squares[size_t(j)][size_t(l)]) {
          squares[size_t(j)][size_t(l)] = total;
          cut[size_t(j)][size_t(l)] = k;
        }
      }
    }
  }
  std::vector<int> blocks(static_cast<size_t>(n));
  for (int j = n, l = L; j > 0; --j) {
    const int k = cut[size_t(j)][size_t(l)];
    STRATA_CHECK(k >= 0, "no balanced split of ", L, " blocks into ", n, " chunks");
    blocks[size_t(j - 1)] = l - k;
    l = k;
  }
  return blocks;
}

void check_explicit(const std::vector<int>& blocks, int L, int n) {
  STRATA_INPUT_CHECK(int(blocks.size()) == n, "parallelism.partition lists ", blocks.size(),
                     " block counts but there are ", n,
                     " model chunks (parallelism.pipeline × parallelism.virtual_stages); give one "
                     "count per chunk");
  for (int g = 0; g < n; ++g) {
    const int b = blocks[size_t(g)];
    const bool end = n > 1 && (g == 0 || g == n - 1);
    STRATA_INPUT_CHECK(b >= (end ? 0 : 1), "parallelism.partition[", g, "] = ", b, ": ",
                       end ? "a block count cannot be negative"
                           : "every chunk but the first and the last (which hold the embedding "
                             "and the head) needs at least one block");
  }
  const int sum = std::accumulate(blocks.begin(), blocks.end(), 0);
  STRATA_INPUT_CHECK(sum == L, "parallelism.partition block counts sum to ", sum,
                     " but model.layers = ", L, "; change the counts so that they sum to ", L);
}

}  // namespace

UnitFlops unit_flops(const ModelSpec& spec) {
  const ModelConfig& m = spec.config;
  const double T = m.seq_len, C = m.hidden;
  const double held = double(spec.tp.heads) * double(m.hidden / m.heads);  // heads held · hd
  UnitFlops out;
  out.block.assign(size_t(m.layers), 0.0);
  for (const UnitSpec& u : spec.units) {
    const double matmul = 2.0 * double(u.numel) * T;
    if (u.kind == UnitKind::Attention) {
      out.block[size_t(u.layer)] += matmul + 4.0 * T * T * held;
    } else if (u.kind == UnitKind::Mlp) {
      out.block[size_t(u.layer)] += matmul;
    } else if (u.kind == UnitKind::Experts) {  // a token passes through top_k of the experts
      // (whole experts: this rank's rows only, 1/tp of them)
      const double rows = spec.ep.whole ? 1.0 / spec.tp.size : 1.0;
      out.block[size_t(u.layer)] += matmul * rows * double(m.moe.top_k) / double(spec.ep.experts);
    } else if (u.kind == UnitKind::FinalNorm) {
      out.head += matmul;
    }
  }
  out.head += 2.0 * double(spec.tp.vocab_rows) * C * T;  // the logits, tied or not
  return out;
}

StagePlan partition(const ModelSpec& spec, int chunks, PartitionMethod method,
                    const std::vector<int>& explicit_blocks) {
  const int L = spec.config.layers, n = chunks;
  STRATA_INPUT_CHECK(n >= 1, "the model needs at least one pipeline chunk, got ", n,
                     " (parallelism.pipeline × parallelism.virtual_stages)");
  STRATA_INPUT_CHECK(method == PartitionMethod::Explicit || explicit_blocks.empty(),
                     "parallelism.partition: block counts are read only by the explicit method, "
                     "not by ",
                     partition_name(method));
  STRATA_INPUT_CHECK(method == PartitionMethod::Explicit || n <= L,
                     "parallelism.pipeline × parallelism.virtual_stages = ", n,
                     " model chunks but model.layers = ", L,
                     "; every chunk needs at least one block: lower parallelism.pipeline or "
                     "parallelism.virtual_stages");
  const Layout lay = layout_of(spec);
  const UnitFlops fl = unit_flops(spec);
  std::vector<int> blocks;
  switch (method) {
    case PartitionMethod::Uniform:
      blocks = uniform_blocks(L, n);
      break;
    case PartitionMethod::Parameters:
      blocks = balanced_blocks(lay.block_params, lay.embedding_params, lay.head_params, n);
      break;
    case PartitionMethod::Time:
      blocks = balanced_blocks(fl.block, fl.embedding, fl.head, n);
      break;
    case PartitionMethod::Explicit:
      STRATA_INPUT_CHECK(!explicit_blocks.empty(),
                         "parallelism.partition = explicit needs the number of blocks of each of "
                         "the ",
                         n, " model chunks");
      check_explicit(explicit_blocks, L, n);
      blocks = explicit_blocks;
      break;
  }
  StagePlan plan;
  plan.blocks = blocks;
  for (int g = 0, layer = 0; g < n; ++g) {
    const int end_layer = layer + blocks[size_t(g)];
    const int begin = g == 0 ? 0 : lay.block_unit[size_t(layer)];
    const int end = g == n - 1 ? int(spec.units.size()) : lay.block_unit[size_t(end_layer)];
    plan.chunks.push_back({begin, end});
    plan.layers_begin.push_back(layer);
    int64_t params = 0;
    for (int u = begin; u < end; ++u) params += spec.units[size_t(u)].numel;
    plan.params.push_back(params);
    double flops = (g == 0 ? fl.embedding : 0.0) + (g == n - 1 ? fl.head : 0.0);
    for (int l = layer; l < end_layer; ++l) flops += fl.block[size_t(l)];
    plan.flops.push_back(flops);
    layer = end_layer;
  }
  return plan;
}

}  // namespace strata::pipeline
