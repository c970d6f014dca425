#pragma once

namespace attnreplay::capture {

// In a Python job, defines the op they report through (define_op) and runs python_entry_points.py
// (built into this library), which wraps the attention entry points that are Python functions, not
// dispatcher ops, as their modules are imported. Does nothing without Python; says once on stderr
// (unless quiet) when it cannot, and never throws.
void install_python_entry_points(bool quiet, void (*define_op)());

}  // namespace attnreplay::capture
