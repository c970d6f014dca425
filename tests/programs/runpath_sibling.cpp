// Lives in a sub-folder found only through its caller's RUNPATH ($ORIGIN/sub).
extern "C" int runpath_sibling_answer() { return 42; }
