#pragma once
// One self-contained HTML page of one record or several side by side (GPUs, commits): a summary
// per kernel, speed against accuracy, a roofline, error by layer and step, sortable tables with
// each row's rerun command, the environment. The page carries its data as JSON and draws its
// charts as SVG with its own script (replay/report/html/), so it needs no network when viewed.
#include <nlohmann/json_fwd.hpp>

#include <string>
#include <utility>
#include <vector>

namespace attnreplay {

struct NamedRecord {
  std::string name;  // what the page calls it: the file's name
  const nlohmann::json* record = nullptr;  // a run's or an audit's (--json)
};

// `baseline`: the kernel speed-ups are over (empty: each record's --baseline, else its fastest
// exact kernel). Throws InputError, naming the record, on one that is neither a run's nor an audit's.
std::string html_report(const std::vector<NamedRecord>& records, const std::string& baseline);

// What the page draws from one record, before it is embedded: its rows, summary and environment.
nlohmann::json report_page_data(const NamedRecord& record, const std::string& baseline);

}  // namespace attnreplay
