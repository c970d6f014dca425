// Exits 0 when a library's bare-name dlopen of its RUNPATH sibling works under LD_PRELOAD.
extern "C" int runpath_load_sibling();
int main() { return runpath_load_sibling(); }
