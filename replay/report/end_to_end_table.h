#pragma once
// `attnreplay e2e`'s table: read from its JSON record (replay/run/end_to_end.h) alone.
#include <nlohmann/json.hpp>

#include <ostream>

namespace attnreplay {

void print_end_to_end(const nlohmann::json& record, std::ostream& out);

}  // namespace attnreplay
