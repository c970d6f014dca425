#pragma once
// The replay's own clock: seconds since this process started (its libraries' loading included),
// so that a record says where a run's wall time went outside the calls: start-up before the first
// call, gaps between calls, the time after the last.

namespace attnreplay {

double seconds_since_process_start();

}  // namespace attnreplay
