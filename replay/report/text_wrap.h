#pragma once
// How the printers keep lines within their width: fields joined by a separator, a line broken
// between fields. One place for the run's call headers and ratios, its closing summary and info.
#include <string>
#include <string_view>
#include <vector>

namespace attnreplay {

// `fields` after `first` (a prefix that may be only spaces), joined by `separator`, in lines of at
// most `width` characters, each line after the first starting with `indent`; a field longer than
// a line has one to itself. Each line ends in '\n'; nothing where no line has any text.
inline std::string wrap_fields(const std::vector<std::string>& fields, std::string first, const std::string& indent,
                               std::string_view separator, std::size_t width = 120) {
  const auto has_text = [](const std::string& line) { return line.find_first_not_of(' ') != std::string::npos; };
  std::string out, line = std::move(first);
  for (const std::string& field : fields) {
    if (has_text(line) && line.size() + separator.size() + field.size() > width) {
      out += line + '\n';
      line = indent;
    }
    if (has_text(line)) line += separator;
    line += field;
  }
  if (has_text(line)) out += line + '\n';
  return out;
}

}  // namespace attnreplay
