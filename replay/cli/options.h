#pragma once
// The flags of `run`, `audit` and `kernels` as one table. Each entry gives the CLI11 option (its
// names, help, default and check), its key in the results JSON's "options" and whether it goes
// into each row's rerun command: a new flag is one entry, and the commands read its value by name.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace CLI {
class App;
class Option;
}

namespace attnreplay {

enum class OptionKind {
  flag,      // present or not
  integer,   // one whole number
  number,    // one real number
  text,      // one word
  list,      // comma-separated words, e.g. --kernels a,b
  repeated,  // one word per occurrence, e.g. --kernel-module a.py --kernel-module b.py
};

// Which commands (and test-list lines) take an option; an entry names any of them.
enum OptionUse : unsigned {
  kRunUse = 1u << 0,
  kAuditUse = 1u << 1,
  kKernelsUse = 1u << 2,
  kTestlistLineUse = 1u << 3,  // one line of run's --testlist: a configuration of its own
};

// What a rerun command must carry: the options that change a row's results.
enum class Rerun {
  never,     // reruns take it some other way (per row, per call) or it changes no result
  when_set,  // given, and its canonical value is not the default
};

enum class ValueCheck { none, positive, non_negative };

struct OptionSpec {
  std::string names;  // CLI11's: "--kernels,--backends", "-q,--quiet"
  OptionKind kind = OptionKind::text;
  std::string help;
  std::string group;  // the --help section
  unsigned uses = kRunUse | kAuditUse | kTestlistLineUse;
  Rerun rerun = Rerun::never;
  // The value it has when not given, shown in --help; empty: unset (none, or the device's default).
  std::string default_value;
  // The values it takes, from the enum's own *_names(); null: any.
  const std::vector<std::string>& (*choices)() = nullptr;
  ValueCheck check = ValueCheck::none;
  // The one spelling of a value that has several ("bf16" -> "bfloat16"), for the JSON and reruns.
  std::string (*canonical)(const std::string& value) = nullptr;

  std::string flag() const;  // the first long name: "--kernels"
  std::string key() const;   // the JSON key: "kernels", "min_samples"
};

// Every option, in --help order.
const std::vector<OptionSpec>& option_table();

// The values one command line (or one test-list line) gave for the entries of a table.
class Options {
 public:
  // Adds the entries of `table` that `use` takes to `app`; their values land here. `table` must
  // outlive this.
  void define(CLI::App& app, OptionUse use, const std::vector<OptionSpec>& table = option_table());

  // Lookups by flag ("--min-time"); an unknown flag is a bug and throws std::logic_error.
  bool given(std::string_view flag) const;
  bool flag(std::string_view flag) const;
  // The value given, else the default; nullopt when neither.
  std::optional<std::string> text(std::string_view flag) const;
  std::optional<std::int64_t> integer(std::string_view flag) const;
  std::optional<double> number(std::string_view flag) const;
  std::vector<std::string> list(std::string_view flag) const;  // given, else the default's items

  // Lets a command fill in a value after parsing (a test-list line's case tag).
  void set(std::string_view flag, const std::string& value);

  // {"min_samples": 20, "timing": "event", "hot_l2": false, "warmup": null, ...}: every entry,
  // with its canonical value (given or default).
  nlohmann::json to_json() const;
  // The rerun command's flags: " --min-samples 20 --hot-l2", in table order, of the entries that
  // a command of `include` takes and none of `exclude` does (audit's own flags: kAuditUse, kRunUse).
  std::string rerun_flags(unsigned include = ~0u, unsigned exclude = 0) const;

 private:
  struct Value {
    const OptionSpec* spec = nullptr;
    std::string text;                // integer, number, text
    std::vector<std::string> items;  // list, repeated
    bool present = false;            // flag
    CLI::Option* option = nullptr;   // counts the occurrences
  };
  const Value& value(std::string_view flag) const;
  std::vector<std::string> values_of(const Value& value) const;  // as given or defaulted, canonical
  std::map<std::string, Value, std::less<>> values_;
  std::vector<std::string> order_;  // flags, in table order
};

}  // namespace attnreplay
