#pragma once
// What a library may do when the process ends (write a log, a profile): where
// ATTNREPLAY_TEST_EXIT_MARK names a file, this object's destructor writes it. Tests that attnreplay
// ends the ordinary way where such code is loaded define one (tests/e2e/test_plugins.py, test_cli.py).
#include <cstdlib>
#include <fstream>

struct WritesAtExit {
  ~WritesAtExit() {
    if (const char* path = std::getenv("ATTNREPLAY_TEST_EXIT_MARK")) std::ofstream(path) << "destructors ran\n";
  }
};
