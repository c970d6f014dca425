// libattncap.so, the library users LD_PRELOAD. It depends on nothing heavy, so any process it
// lands in (shells, launchers, compiler children) runs as before. Once libtorch is in the process
// it loads the torch part (libattncap_torch.so), and only from a safe point: after the outermost
// dlopen has returned, or before main() of a program linked to libtorch. The torch part is built for
// one torch version and C++ ABI: the one the job loaded picks it, and without one built for it the
// job runs as if nothing were preloaded, with one line on stderr. Loading from inside
// another library's constructor is unsafe: cuBLASLt's constructor calls dlopen while libtorch is
// mapped but not yet initialised.
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <string>
#include <vector>

namespace {

using DlopenFn = void* (*)(const char*, int);
using MainFn = int (*)(int, char**, char**);

thread_local int dlopen_depth = 0;
// 0: torch part not loaded, 1: loading or loaded, 2: given up. Not std::call_once: the torch
// part's own loading may call dlopen on this thread again.
std::atomic<int> torch_stage{0};
MainFn program_main = nullptr;

DlopenFn real_dlopen() {
  static DlopenFn real = reinterpret_cast<DlopenFn>(dlsym(RTLD_NEXT, "dlopen"));
  return real;
}

bool disabled() {
  const char* value = std::getenv("ATTNCAP_ENABLE");
  return value && std::strcmp(value, "0") == 0;
}

// The libtorch_cpu.so in the process, by its path; empty while there is none.
int find_libtorch(struct dl_phdr_info* info, size_t, void* found) {
  if (info->dlpi_name && std::strstr(info->dlpi_name, "libtorch_cpu.so")) {
    *static_cast<std::string*>(found) = info->dlpi_name;
    return 1;
  }
  return 0;
}

std::string libtorch_path() {
  std::string found;
  dl_iterate_phdr(find_libtorch, &found);
  return found;
}

std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// The first line of `path` that starts with `prefix`, after it; empty when none.
std::string line_after(const std::string& path, const char* prefix) {
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (!file) return {};
  char line[512];
  std::string value;
  while (std::fgets(line, sizeof(line), file)) {
    if (std::strncmp(line, prefix, std::strlen(prefix)) == 0) {
      value = line + std::strlen(prefix);
      break;
    }
  }
  std::fclose(file);
  while (!value.empty() && std::strchr("\r\n \"'", value.back())) value.pop_back();
  while (!value.empty() && std::strchr(" \"'", value.front())) value.erase(0, 1);
  return value;
}

// The torch the job loaded: its version as the package names it (torch/version.py in a wheel,
// build-version in a libtorch archive) and the C++ ABI its libc10 was built with. A capture part
// is built for exactly one of these.
struct JobTorch {
  std::string root;     // the torch package (or libtorch) folder
  std::string version;  // "2.8.0+cu128"; empty when it cannot be read
  int cxx11_abi = -1;   // _GLIBCXX_USE_CXX11_ABI; -1 when it cannot be told
  std::string key() const { return "torch-" + version + "-cxx11abi" + std::to_string(cxx11_abi); }
};

JobTorch job_torch(const std::string& libtorch) {
  JobTorch torch;
  torch.root = folder_of(folder_of(libtorch));
  torch.version = line_after(torch.root + "/version.py", "__version__ =");
  if (torch.version.empty()) torch.version = line_after(torch.root + "/build-version", "");
  // torch's check-failure entry point takes a std::string: its mangled name says which ABI.
  const std::string c10 = folder_of(libtorch) + "/libc10.so";
  if (void* handle = real_dlopen()(c10.c_str(), RTLD_LAZY | RTLD_NOLOAD)) {
    if (dlsym(handle, "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE")) {
      torch.cxx11_abi = 1;
    } else if (dlsym(handle, "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs")) {
      torch.cxx11_abi = 0;
    }
    dlclose(handle);
  }
  dlerror();
  return torch;
}

std::string own_folder() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&own_folder), &info) || !info.dli_fname) return ".";
  return folder_of(info.dli_fname);
}

// Where capture parts built later go (attnreplay-capture-build): $ATTNCAP_PARTS_DIR, else the
// user's cache.
std::string cache_parts_folder() {
  if (const char* dir = std::getenv("ATTNCAP_PARTS_DIR")) return dir;
  if (const char* cache = std::getenv("XDG_CACHE_HOME")) return std::string(cache) + "/attnreplay/capture-parts";
  if (const char* home = std::getenv("HOME")) return std::string(home) + "/.cache/attnreplay/capture-parts";
  return {};
}

// The part built for `torch`: the one installed beside this library (built with attnreplay), then
// one built since into the cache. Empty when neither exists: a part for another torch is never
// loaded, since its C++ ABI would not match the job's libraries.
std::string torch_part_path(const JobTorch& torch) {
  if (const char* path = std::getenv("ATTNCAP_TORCH_LIB")) return path;
  if (torch.version.empty() || torch.cxx11_abi < 0) return {};
  for (const std::string& folder : {own_folder() + "/attncap-parts", cache_parts_folder()}) {
    if (folder.empty()) continue;
    const std::string candidate = folder + "/" + torch.key() + "/libattncap_torch.so";
    if (access(candidate.c_str(), R_OK) == 0) return candidate;
  }
  return {};
}

void load_torch_part() {
  if (torch_stage.load(std::memory_order_acquire) != 0 || disabled()) return;
  const std::string libtorch = libtorch_path();
  if (libtorch.empty()) return;
  int expected = 0;
  if (!torch_stage.compare_exchange_strong(expected, 1)) return;
  const JobTorch torch = job_torch(libtorch);
  const std::string path = torch_part_path(torch);
  if (path.empty()) {
    // One line, and the job goes on exactly as without the preload.
    std::fprintf(stderr,
                 "[attncap] capture is off: no capture part is built for this job's torch %s (C++11 ABI %d, %s); "
                 "build it once with: %s/../bin/attnreplay-capture-build --torch %s\n",
                 torch.version.empty() ? "(version unknown)" : torch.version.c_str(), torch.cxx11_abi,
                 torch.root.c_str(), own_folder().c_str(), torch.root.c_str());
    torch_stage.store(2);
    return;
  }
  void* handle = real_dlopen()(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "[attncap] capture is off: cannot load %s: %s\n", path.c_str(), dlerror());
    torch_stage.store(2);
    return;
  }
  using StartFn = void (*)();
  auto start = reinterpret_cast<StartFn>(dlsym(handle, "attncap_start"));
  if (!start) {
    std::fprintf(stderr, "[attncap] capture is off: %s has no attncap_start\n", path.c_str());
    torch_stage.store(2);
    return;
  }
  start();
}

// The folders glibc lists for `object` with RTLD_DI_SERINFO, in search order: its RPATH,
// LD_LIBRARY_PATH, its RUNPATH ($ORIGIN expanded), then the system folders.
std::vector<std::string> search_folders(void* object) {
  std::vector<std::string> folders;
  Dl_serinfo size{};
  if (dlinfo(object, RTLD_DI_SERINFOSIZE, &size) != 0 || size.dls_size == 0) return folders;
  auto* paths = static_cast<Dl_serinfo*>(std::malloc(size.dls_size));
  if (!paths) return folders;
  *paths = size;
  if (dlinfo(object, RTLD_DI_SERINFO, paths) == 0) {
    for (unsigned i = 0; i < paths->dls_cnt; ++i) folders.emplace_back(paths->dls_serpath[i].dls_name);
  }
  std::free(paths);
  return folders;
}

// The system folders: what this library (which has no RPATH or RUNPATH) is given beyond
// LD_LIBRARY_PATH. glibc leaves them, and its ld.so.cache, for last.
const std::vector<std::string>& system_folders() {
  static const std::vector<std::string> folders = [] {
    std::vector<std::string> result;
    Dl_info info{};
    struct link_map* self = nullptr;
    if (!dladdr1(reinterpret_cast<void*>(&own_folder), &info, reinterpret_cast<void**>(&self),
                 RTLD_DL_LINKMAP) || !self) {
      return result;
    }
    const char* env = std::getenv("LD_LIBRARY_PATH");
    const std::string library_path = env ? std::string(":") + env + ":" : "";
    for (const std::string& folder : search_folders(self)) {
      if (library_path.find(":" + folder + ":") == std::string::npos) result.push_back(folder);
    }
    return result;
  }();
  return folders;
}

// Opens `file` as glibc would for `caller`. A wrapper's own dlopen call makes glibc search with the
// wrapper's RPATH/RUNPATH instead of the real caller's, and bare-name loads (cuDNN's and torch's
// NVRTC sub-libraries) then fail. So a bare name is first looked for in the caller's own search
// folders, in glibc's order, up to the system folders, which glibc itself then searches.
void* open_as(const char* file, int mode, void* caller) {
  DlopenFn real = real_dlopen();
  if (!file || std::strchr(file, '/')) return real(file, mode);
  // Our probes must not leave an error behind for a caller that checks dlerror() after success.
  auto plain = [&] {
    dlerror();
    return real(file, mode);
  };
  // Already loaded under that name: a repeated dlopen returns it, whoever calls.
  if (void* loaded = real(file, mode | RTLD_NOLOAD)) return loaded;
  Dl_info info{};
  struct link_map* caller_map = nullptr;
  if (!dladdr1(caller, &info, reinterpret_cast<void**>(&caller_map), RTLD_DL_LINKMAP) || !caller_map) {
    return plain();
  }
  const std::vector<std::string>& system = system_folders();
  for (const std::string& folder : search_folders(caller_map)) {
    if (std::find(system.begin(), system.end(), folder) != system.end()) break;
    const std::string candidate = folder + "/" + file;
    if (access(candidate.c_str(), F_OK) != 0) continue;
    dlerror();
    if (void* handle = real(candidate.c_str(), mode)) return handle;
  }
  return plain();
}

int main_with_capture(int argc, char** argv, char** envp) {
  // A program linked to libtorch: every library is initialised by now.
  load_torch_part();
  return program_main(argc, argv, envp);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* dlopen(const char* file, int mode) {
  void* caller = __builtin_return_address(0);
  ++dlopen_depth;
  void* handle = open_as(file, mode, caller);
  --dlopen_depth;
  // Python loads libtorch as a dependency of torch/_C*.so, never by name: look after the
  // outermost load has returned, when every constructor it triggered has run.
  if (dlopen_depth == 0 && torch_stage.load(std::memory_order_relaxed) == 0) load_torch_part();
  return handle;
}

using StartMainFn = int (*)(MainFn, int, char**, void (*)(), void (*)(), void (*)(), void*);

__attribute__((visibility("default"))) int __libc_start_main(MainFn main, int argc, char** argv, void (*init)(),
                                                             void (*fini)(), void (*rtld_fini)(), void* stack_end) {
  auto real = reinterpret_cast<StartMainFn>(dlsym(RTLD_NEXT, "__libc_start_main"));
  program_main = main;
  return real(main_with_capture, argc, argv, init, fini, rtld_fini, stack_end);
}

}  // extern "C"
