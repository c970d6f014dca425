#pragma once
// `attnreplay compare`'s output (replay/judge/run_comparison.h): a per-kernel summary and the rows
// that changed, as text for the terminal or as Markdown for a pull request's comment.
#include <string>

#include "replay/judge/run_comparison.h"

namespace attnreplay {

struct ComparisonView {
  bool every_row = false;           // -v: every (call, kernel), not only those that changed
  double fail_percent = -1;         // --fail-on-regression's; below 0 when not given
  std::size_t row_limit = 40;       // rows listed without -v
};

std::string comparison_text(const RunComparison& comparison, const ComparisonView& view);
std::string comparison_markdown(const RunComparison& comparison, const ComparisonView& view);

}  // namespace attnreplay
