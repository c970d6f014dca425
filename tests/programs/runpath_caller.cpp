// Opens a sibling library by bare name, as cuDNN and torch's NVRTC loader do. glibc finds it
// through this library's RUNPATH, which only works if the dlopen is seen as coming from here.
#include <dlfcn.h>

#include <cstdio>

extern "C" int runpath_load_sibling() {
  void* handle = dlopen("libruntest_sibling.so", RTLD_NOW);
  if (!handle) {
    std::fprintf(stderr, "dlopen failed: %s\n", dlerror());
    return 1;
  }
  using Answer = int (*)();
  auto answer = reinterpret_cast<Answer>(dlsym(handle, "runpath_sibling_answer"));
  return answer && answer() == 42 ? 0 : 1;
}
