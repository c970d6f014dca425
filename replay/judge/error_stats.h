#pragma once
// How far a kernel's output is from the exact reference, in the measures users compare: ours,
// aiter's compare-to-reference figures, and the Flux notebook's absmax / MAE / MSE.
#include <cstdint>
#include <optional>
#include <vector>

#include "formats/host_tensor.h"

namespace attnreplay {

struct TensorMoments {
  double min = 0, max = 0, mean = 0, std = 0;  // population std
};

// The figures over one set of compared elements.
struct ErrorFigures {
  std::int64_t elements = 0;  // compared elements where the output is finite
  // Over elements where both are finite:
  double max_abs = 0;   // = the Flux notebook's absmax
  double mean_abs = 0;  // = MAE
  double mse = 0;
  double rmse = 0;
  double std_abs = 0;   // std of |error| (aiter)
  double rel_l1 = 0;    // sum|o - r| / sum|r|
  double rel_l2 = 0;    // ||o - r|| / ||r||
  double cosine = 0;    // <o, r> / (||o|| ||r||); 1 when both are zero
  // FlashInfer-Bench's figures: max |o - r| / (|r| + 1e-8), and the elements its default tolerance
  // rejects (|o - r| > 1e-2 and |o - r| / (|r| + 1e-8) > 1e-2).
  double max_rel = 0;
  std::int64_t beyond_tolerance = 0;
  std::int64_t nan_count = 0;  // in the kernel output
  std::int64_t inf_count = 0;
  // Where max_abs sits, as (batch, head, query row, channel).
  std::int64_t worst_batch = 0, worst_head = 0, worst_row = 0, worst_channel = 0;
  TensorMoments output, reference;
};

// What a kernel is judged by. Rows that see no key (a left-padded prompt's pads) have no defined
// attention, and backends give them different things (0, NaN, the mean of V): where a call has
// such rows, the figures leave them out, and the whole call's, those rows included, stand beside
// them.
struct ErrorStats : ErrorFigures {
  bool sampled = false;            // only `rows_compared` query rows were compared
  std::int64_t rows_compared = 0;  // per (batch, head)
  std::int64_t no_key_rows = 0;    // (batch, head, row) triples that see no key
  // Set only where no_key_rows > 0 (ReferenceOutput::no_key).
  std::optional<ErrorFigures> including_rows_without_a_key;
};

// One (batch, query head) of a comparison: a call's error often sits in a few heads, which the
// whole-tensor figures average away. Same definitions as ErrorStats, over that head's elements in
// rows that see a key.
struct HeadError {
  std::int64_t batch = 0, head = 0;
  double rel_l2 = 0;
  double cosine = 0;
  double max_abs = 0;
  std::int64_t nonfinite_count = 0;  // NaN and Inf outputs, left out of the rest
};

}  // namespace attnreplay
