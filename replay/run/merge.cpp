#include "replay/run/merge.h"
#include "replay/run/sharding.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "formats/errors.h"
#include "replay/report/record_files.h"

namespace attnreplay {
namespace fs = std::filesystem;
namespace {

struct Part {
  std::string path;
  nlohmann::json record;
  int rank = 0, world_size = 0;
};

// A part's shard object, checked: throws naming the file and the field.
Part read_part(const std::string& path) {
  Part part{path, read_record_file(path)};
  const nlohmann::json& r = part.record;
  if (!r.is_object() || r.value("schema", "") != "attnreplay.results") {
    throw InputError(fmt::format("{}: not an attnreplay results record (no \"schema\": \"attnreplay.results\")", path));
  }
  if (!r.contains("shard")) {
    throw InputError(fmt::format("{}: not a part of a sharded run (no \"shard\" object): a whole record needs no merge", path));
  }
  try {
    const nlohmann::json& shard = r.at("shard");
    part.rank = shard.at("rank").get<int>();
    part.world_size = shard.at("world_size").get<int>();
    if (part.world_size < 1 || part.rank < 0 || part.rank >= part.world_size) throw std::out_of_range("rank");
    if (shard.at("order").size() != r.at("calls").size()) {
      throw InputError(fmt::format("{}: \"shard.order\" has {} entries for {} calls", path, shard.at("order").size(),
                                   r.at("calls").size()));
    }
  } catch (const nlohmann::json::exception& error) {
    throw InputError(fmt::format("{}: \"shard\" is incomplete ({})", path, error.what()));
  } catch (const std::out_of_range&) {
    throw InputError(fmt::format("{}: \"shard\": rank {} is not below the world size {}", path,
                                 r["shard"].value("rank", -1), r["shard"].value("world_size", -1)));
  }
  return part;
}

// The part file another rank of `part`'s run would have written, for messages.
std::string sibling_path(const Part& part, int rank) {
  const std::string from = fmt::format(".part{}-of-{}", part.rank, part.world_size);
  std::string path = part.path;
  const auto at = path.rfind(from);
  if (at == std::string::npos) return fmt::format("rank {}'s part", rank);
  return path.replace(at, from.size(), fmt::format(".part{}-of-{}", rank, part.world_size));
}

// A part's command line without what may differ between the processes of one run: the program's
// path, and the flags that give each process its rank or its wait.
nlohmann::json run_flags(const Part& part) {
  nlohmann::json flags = nlohmann::json::array();
  const nlohmann::json argv = part.record.value("argv", nlohmann::json::array());
  for (std::size_t i = 1; i < argv.size(); ++i) {
    const std::string arg = argv[i].is_string() ? argv[i].get<std::string>() : argv[i].dump();
    if (arg == "--shard" || arg == "--merge-wait") {
      ++i;
      continue;
    }
    if (arg.rfind("--shard=", 0) == 0 || arg.rfind("--merge-wait=", 0) == 0) continue;
    flags.push_back(arg);
  }
  return flags;
}

void check_same_run(const Part& first, const Part& other) {
  auto differs = [&](const char* what, const nlohmann::json& a, const nlohmann::json& b) {
    if (a != b) {
      throw InputError(fmt::format("{} and {}: parts of different runs ({} {} vs {})", first.path, other.path, what,
                                   a.dump(), b.dump()));
    }
  };
  differs("world size", first.world_size, other.world_size);
  differs("command line", run_flags(first), run_flags(other));
  differs("launch", first.record["shard"].value("launch_id", ""), other.record["shard"].value("launch_id", ""));
  differs("call count", first.record["shard"].value("run_calls", -1), other.record["shard"].value("run_calls", -1));
}

}  // namespace

nlohmann::json merge_parts(const std::vector<std::string>& part_paths) {
  if (part_paths.empty()) throw InputError("merge: no parts given");
  std::vector<Part> parts;
  for (const std::string& path : part_paths) parts.push_back(read_part(path));
  std::map<int, const Part*> by_rank;
  for (const Part& part : parts) {
    check_same_run(parts.front(), part);
    const auto [found, added] = by_rank.emplace(part.rank, &part);
    if (!added) {
      throw InputError(fmt::format("{} and {} are both rank {} of {} (a part given twice?)", found->second->path,
                                   part.path, part.rank, part.world_size));
    }
  }
  std::vector<std::string> missing;
  for (int rank = 0; rank < parts.front().world_size; ++rank) {
    if (!by_rank.count(rank)) missing.push_back(sibling_path(parts.front(), rank));
  }
  if (!missing.empty()) {
    throw InputError(fmt::format("merge: {} of {} parts missing: {}", missing.size(), parts.front().world_size,
                                 fmt::join(missing, ", ")));
  }

  // Calls in the order one process replays them; each place in that order taken once.
  std::map<std::int64_t, std::pair<const Part*, const nlohmann::json*>> calls;
  nlohmann::json errors = nlohmann::json::array();
  std::set<std::string> seen_errors;
  nlohmann::json shards = nlohmann::json::array(), compilations = nlohmann::json::array();
  std::string started = parts.front().record.value("started_utc", "");
  for (const auto& [rank, part] : by_rank) {
    const nlohmann::json& r = part->record;
    const nlohmann::json& order = r["shard"]["order"];
    for (std::size_t i = 0; i < order.size(); ++i) {
      const std::int64_t place = order[i].get<std::int64_t>();
      const auto [found, added] = calls.emplace(place, std::pair{part, &r["calls"][i]});
      if (!added) {
        const nlohmann::json& call = r["calls"][i];
        throw InputError(fmt::format("{} and {} both hold call {} of {} (parts of overlapping runs?)",
                                     found->second.first->path, part->path, call.value("call_index", -1),
                                     call.value("source", "?")));
      }
    }
    for (nlohmann::json compilation : r.value("compilations_ahead", nlohmann::json::array())) {
      compilation["rank"] = rank;
      compilations.push_back(std::move(compilation));
    }
    // A capture every process failed to open is reported by each: once is enough.
    for (const auto& error : r.value("input_errors", nlohmann::json::array())) {
      if (seen_errors.insert(error.dump()).second) errors.push_back(error);
    }
    started = std::min(started, r.value("started_utc", started));
    const auto& environment = r.value("environment", nlohmann::json::object());
    shards.push_back({{"rank", rank},
                      {"file", part->path},
                      {"host", r["shard"].value("host", "")},
                      {"local_rank", r["shard"].value("local_rank", 0)},
                      {"gpu", environment.value("gpu", "")},
                      {"calls", order.size()},
                      {"recorded_at_s", r.value("recorded_at_s", nlohmann::json())}});
  }
  nlohmann::json merged = by_rank.at(0)->record;
  const nlohmann::json shard = merged["shard"];
  merged.erase("shard");
  merged.erase("recorded_at_s");  // each part's, on its own process's clock, is in its entry
  merged["started_utc"] = started;
  merged["calls"] = nlohmann::json::array();
  for (const auto& [place, call] : calls) merged["calls"].push_back(*call.second);
  merged["input_errors"] = errors;
  merged["compilations_ahead"] = compilations;
  merged["sharded"] = {{"world_size", shard["world_size"]},
                       {"launcher", shard.value("launcher", "")},
                       {"launch_id", shard.value("launch_id", "")},
                       {"parts", shards}};
  return merged;
}

std::vector<std::string> wait_for_parts(const std::string& path, const std::string& own_part, const ShardPart& own,
                                        fs::file_time_type started, std::chrono::duration<double> timeout) {
  const int world = own.shard.world_size;
  std::vector<std::string> paths(static_cast<std::size_t>(world));
  paths[0] = own_part;
  // Clocks of a shared folder's server may be a little off this node's.
  const auto earliest = started - std::chrono::minutes(1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<std::string> missing;
    for (int rank = 1; rank < world; ++rank) {
      std::string& found = paths[static_cast<std::size_t>(rank)];
      if (!found.empty()) continue;
      const std::string candidate = part_path(path, rank, world);
      std::error_code error;
      const auto written = fs::last_write_time(candidate, error);
      // Parts are renamed into place whole, so one that exists can be read.
      bool ours = !error;
      if (ours && own.shard.launch_id.empty()) ours = written >= earliest;
      if (ours && !own.shard.launch_id.empty()) {
        try {
          ours = read_record_file(candidate)["shard"].value("launch_id", "") == own.shard.launch_id;
        } catch (const std::exception&) {
          ours = false;
        }
      }
      if (ours) found = candidate;
      else missing.push_back(candidate);
    }
    if (missing.empty()) return paths;
    if (std::chrono::steady_clock::now() >= deadline) {
      throw InputError(fmt::format("merge: after {:.0f} s, {} of {} parts have not appeared: {}", timeout.count(),
                                   missing.size(), world, fmt::join(missing, ", ")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace attnreplay
