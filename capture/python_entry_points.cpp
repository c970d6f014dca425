#include "capture/python_entry_points.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <string>

#include "capture/python_api.h"
#include "capture/python_entry_points_source.h"  // kPythonEntryPointsSource, generated from the .py

namespace attnreplay::capture {

void install_python_entry_points(bool quiet, void (*define_op)()) {
  const Python& py = python();
  if (!py.is_initialized || !py.is_initialized()) return;  // a C++ program: no Python entry points
  auto say = [&](const std::string& why) {
    if (!quiet) {
      std::fprintf(stderr, "[attncap] Python entry points (FlashInfer's wrappers, flash_attn_with_kvcache) are not "
                           "observed: %s\n", why.c_str());
    }
  };
  if (!py.runs_code) return say("this Python lacks a function capture needs");
  try {
    define_op();
  } catch (const c10::Error& error) {
    return say(error.what_without_backtrace());
  } catch (const std::exception& error) {
    return say(error.what());
  }
  // The file name marks capture's frames, which call sites skip (call_site.cpp).
  constexpr const char* kFile = "<attncap>/python_entry_points.py";
  constexpr int kFileInput = 257;  // Py_file_input
  const int gil = py.gil_ensure();
  std::string error;
  Python::Object code = py.compile(kPythonEntryPointsSource, kFile, kFileInput);
  Python::Object module = code ? py.exec_module("_attncap_python_entry_points", code, kFile) : nullptr;
  Python::Object install = nullptr, result = nullptr;
  if (module) {
    Python::Object flag = py.bool_from(quiet ? 1 : 0);
    if (flag && py.set_attr(module, "QUIET", flag) == 0) install = py.get_attr(module, "install");
    if (flag) py.decref(flag);
  }
  if (install) result = py.call(install, nullptr);
  if (!result) error = py.take_error();
  for (Python::Object owned : {code, module, install, result}) {
    if (owned) py.decref(owned);
  }
  py.gil_release(gil);
  if (!result) say(error.empty() ? "running them failed" : error);
}

}  // namespace attnreplay::capture
