// The options table (replay/cli/options.cpp): one entry gives a flag its CLI11 option and check,
// its --help line, its key in the JSON's "options" and its place in the rerun command.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/quantized_attention.h"
#include "replay/cli/options.h"
#include "replay/measure/timers.h"

using namespace attnreplay;
using Catch::Matchers::ContainsSubstring;

namespace {

const std::vector<std::string>& tile_names() {
  static const std::vector<std::string> names{"small", "large"};
  return names;
}

// Parses `line` as `use`'s flags of `table`.
void parse(CLI::App& app, Options& options, const std::string& line, OptionUse use,
           const std::vector<OptionSpec>& table = option_table()) {
  std::vector<std::string> inputs;
  app.add_option("inputs", inputs);
  options.define(app, use, table);
  app.parse(line, false);
}

}  // namespace

TEST_CASE("options: a flag added to the table is in --help, the JSON and the rerun command, with no other edit") {
  std::vector<OptionSpec> table = option_table();
  table.push_back({"--tile-size", OptionKind::text, "tile size of the new kernel", "Device and timing", kRunUse,
                   Rerun::when_set, "small", tile_names});

  CLI::App app{"run"};
  Options options;
  parse(app, options, "caps/ --tile-size large --min-samples 20", kRunUse, table);

  CHECK_THAT(app.help(), ContainsSubstring("--tile-size"));
  CHECK_THAT(app.help(), ContainsSubstring("tile size of the new kernel"));
  CHECK(options.to_json().at("tile_size") == "large");
  CHECK_THAT(options.rerun_flags(), ContainsSubstring(" --tile-size large"));
  CHECK(options.text("--tile-size") == "large");

  // Its check comes from the table too.
  CLI::App bad_app{"run"};
  Options bad;
  CHECK_THROWS_AS(parse(bad_app, bad, "--tile-size huge", kRunUse, table), CLI::ValidationError);
}

TEST_CASE("options: rerun flags carry what changes results, at non-default values, in table order") {
  CLI::App app{"run"};
  Options options;
  parse(app, options,
        "cap.h5 --kernels flash-cpu --timing event --hot-l2 --quant_gran per_thread --min-time 0.2 --json out.json "
        "--case_tag x --dtype bf16",
        kRunUse);
  // --timing event is the default; --kernels, --json, --case_tag and the generated call's flags go in
  // some other way (per row, or not at all).
  CHECK(options.rerun_flags() == " --min-time 0.2 --hot-l2 --quant_gran per_thread");
  CHECK(options.rerun_flags(kAuditUse, kRunUse).empty());
  // Spellings are made one in the JSON.
  const nlohmann::json json = options.to_json();
  CHECK(json.at("dtype") == "bfloat16");
  CHECK(json.at("kernels") == nlohmann::json::array({"flash-cpu"}));
  CHECK(json.at("min_time") == 0.2);
  CHECK(json.at("warmup").is_null());
  CHECK(json.at("hot_l2") == true);
  CHECK(json.at("timed_calls_per_group") == 1);
}

TEST_CASE("options: audit's own rerun flags, apart from run's") {
  CLI::App app{"audit"};
  Options options;
  parse(app, options, "caps/ --full-timing --cast-inputs bf16 --worst 2 --max-noise 1", kAuditUse);
  CHECK(options.rerun_flags(kRunUse) == " --max-noise 1");
  CHECK(options.rerun_flags(kAuditUse, kRunUse) == " --full-timing --cast-inputs bfloat16");
  CHECK(options.integer("--worst") == 2);
  CHECK_THROWS_AS(options.text("--testlist"), std::logic_error);  // not one of audit's
}

TEST_CASE("options: values and defaults by flag; choices from the enums' own names") {
  CLI::App app{"run"};
  Options options;
  parse(app, options, "--shape 1,2,3,4 --kernel-module a.py --kernel-module 'b c.py'", kRunUse);
  CHECK(options.given("--shape"));
  CHECK_FALSE(options.given("--timing"));
  CHECK(options.text("--timing") == "event");
  CHECK_FALSE(options.text("--scale"));
  CHECK(options.list("--kernels") == std::vector<std::string>{"all"});
  CHECK(options.list("--kernel-module") == std::vector<std::string>{"a.py", "b c.py"});
  CHECK_THROWS_AS(options.flag("--no-such-flag"), std::logic_error);

  for (const OptionSpec& spec : option_table()) {
    if (spec.flag() == "--timing") CHECK(spec.choices() == timing_method_names());
    if (spec.flag() == "--quant_gran") CHECK(spec.choices() == quant_granularity_names());
  }
  CLI::App bad_app{"run"};
  Options bad;
  CHECK_THROWS_AS(parse(bad_app, bad, "--timing wall", kRunUse), CLI::ValidationError);
  CLI::App bad_number{"run"};
  Options bad_too;
  CHECK_THROWS_AS(parse(bad_number, bad_too, "--min-samples many", kRunUse), CLI::ValidationError);
}

TEST_CASE("options: every entry has a long name, a help text and a command") {
  std::vector<std::string> keys;
  for (const OptionSpec& spec : option_table()) {
    INFO(spec.names);
    CHECK_FALSE(spec.help.empty());
    CHECK(spec.uses != 0);
    CHECK(spec.flag().rfind("--", 0) == 0);
    keys.push_back(spec.key());
  }
  std::sort(keys.begin(), keys.end());
  CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());
}
