// A library preloaded into attnreplay, as a tool (heaptrack, a tracer) is: its destructors must run.
#include "tests/programs/exit_mark.h"

WritesAtExit writes_at_exit;
