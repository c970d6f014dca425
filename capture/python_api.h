#pragma once
// The few CPython functions capture needs, looked up in the running process: the capture library
// does not link libpython, and a C++ program has none (every pointer is then null).
#include <string>

namespace attnreplay::capture {

struct Python {
  using Object = void*;
  int (*is_initialized)() = nullptr;
  int (*gil_ensure)() = nullptr;
  void (*gil_release)(int) = nullptr;
  // The call site (call_site.cpp): frames, their code and locals.
  Object (*current_frame)() = nullptr;
  Object (*frame_code)(Object) = nullptr;
  Object (*frame_back)(Object) = nullptr;
  int (*frame_line)(Object) = nullptr;
  Object (*frame_locals)(Object) = nullptr;
  Object (*get_attr)(Object, const char*) = nullptr;
  Object (*mapping_item)(Object, const char*) = nullptr;
  const char* (*utf8)(Object) = nullptr;
  void (*decref)(Object) = nullptr;
  void (*clear_error)() = nullptr;
  Object (*sys_object)(const char*) = nullptr;         // PySys_GetObject: borrowed
  Object (*dict_item)(Object, const char*) = nullptr;  // PyDict_GetItemString: borrowed
  // Running capture's own Python code (python_entry_points.cpp).
  Object (*compile)(const char* source, const char* file, int start) = nullptr;  // Py_CompileString
  Object (*exec_module)(const char* name, Object code, const char* file) = nullptr;
  int (*set_attr)(Object, const char*, Object) = nullptr;
  Object (*bool_from)(long) = nullptr;
  Object (*call)(Object, Object) = nullptr;  // PyObject_CallObject
  void (*fetch_error)(Object*, Object*, Object*) = nullptr;
  Object (*str)(Object) = nullptr;

  bool usable = false;    // for the call site
  bool runs_code = false;  // for capture's own Python code

  Python();
  // object.name as text; empty (the error cleared) when it has none.
  std::string attribute_text(Object object, const char* name) const;
  // The pending Python error as "Type: message", cleared; empty when none.
  std::string take_error() const;
};

const Python& python();

}  // namespace attnreplay::capture
