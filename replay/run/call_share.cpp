#include "replay/run/call_share.h"

#include "replay/run/sharding.h"

#include <memory>
#include <set>

#include "formats/errors.h"
#include "replay/judge/attention_work.h"
#include "replay/measure/gpu.h"
#include "replay/run/timing_groups.h"

namespace attnreplay {

bool CallShare::take_generated() {
  const std::int64_t place = part_.run_calls++;
  const Shard& shard = part_.shard;
  generated_place_ = place % shard.world_size == shard.rank ? place : -1;
  return generated_place_ >= 0;
}

void CallShare::replayed_generated() {
  if (generated_place_ >= 0) part_.order.push_back(generated_place_);
}

std::vector<std::function<bool(std::int64_t)>> CallShare::take_captured(
    const std::vector<CaptureSource*>& sources, const std::function<bool(std::int64_t)>& wanted) {
  struct Listed {
    std::size_t source;
    std::int64_t call_index;
  };
  std::vector<Listed> listed;
  std::vector<ShareableCall> shareable;
  for (std::size_t s = 0; s < sources.size(); ++s) {
    for (std::size_t position = 0; position < sources[s]->size(); ++position) {
      try {
        const AttentionCall header = sources[s]->load(position, /*with_data=*/false);
        if (wanted && !wanted(header.call_index)) continue;
        listed.push_back({s, header.call_index});
        shareable.push_back({attention_work(header).flops, timing_key(header)});
      } catch (const InputError&) {
      }
    }
  }
  const std::vector<int> rank_of = assign_calls(shareable, part_.shard.world_size, timed_per_group_,
                                                gpu_present() ? ShareCosts::gpu() : ShareCosts::cpu());
  places_.assign(sources.size(), {});
  auto mine = std::make_shared<std::vector<std::set<std::int64_t>>>(sources.size());
  for (std::size_t i = 0; i < listed.size(); ++i) {
    const std::int64_t place = part_.run_calls++;
    if (rank_of[i] != part_.shard.rank) continue;
    (*mine)[listed[i].source].insert(listed[i].call_index);
    places_[listed[i].source][listed[i].call_index] = place;
  }
  std::vector<std::function<bool(std::int64_t)>> predicates;
  for (std::size_t s = 0; s < sources.size(); ++s) {
    predicates.push_back([mine, s](std::int64_t call_index) { return (*mine)[s].count(call_index) > 0; });
  }
  return predicates;
}

void CallShare::replayed(std::size_t source, std::int64_t call_index) {
  part_.order.push_back(places_.at(source).at(call_index));
}

}  // namespace attnreplay
