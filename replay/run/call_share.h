#pragma once
// One process's share of a run's calls under a launcher (replay/run/sharding.h). Every process lists
// the same calls in the same order (the generated call, then each capture's calls that --calls
// selects), plans the same share-out and keeps its own; each call's place in that order goes into
// the part, so that `attnreplay merge` restores one process's order.
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "formats/capture_source.h"
#include "replay/results.h"

namespace attnreplay {

class CallShare {
 public:
  // Records into `part`, whose shard says which share is this process's.
  CallShare(ShardPart& part, int timed_per_group) : part_(part), timed_per_group_(timed_per_group) {}

  // Whether this process replays the next generated call; generated calls go round the ranks.
  bool take_generated();
  // Which of the calls of `sources` (those `wanted` accepts; all when it is empty) this process
  // replays: a predicate on call indices per source. Calls whose header cannot be read are left
  // to every process, which each report the error (merge keeps it once).
  std::vector<std::function<bool(std::int64_t)>> take_captured(const std::vector<CaptureSource*>& sources,
                                                               const std::function<bool(std::int64_t)>& wanted);
  // Notes that a call taken above was replayed, in replay order: its place goes into the part.
  void replayed_generated();
  void replayed(std::size_t source, std::int64_t call_index);

 private:
  ShardPart& part_;
  int timed_per_group_;
  std::int64_t generated_place_ = -1;
  std::vector<std::map<std::int64_t, std::int64_t>> places_;  // per source of the last plan
};

}  // namespace attnreplay
