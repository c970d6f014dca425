#include "capture/python_api.h"

#include <dlfcn.h>

namespace attnreplay::capture {

Python::Python() {
  auto find = [](const char* name) { return dlsym(RTLD_DEFAULT, name); };
  is_initialized = reinterpret_cast<int (*)()>(find("Py_IsInitialized"));
  gil_ensure = reinterpret_cast<int (*)()>(find("PyGILState_Ensure"));
  gil_release = reinterpret_cast<void (*)(int)>(find("PyGILState_Release"));
  current_frame = reinterpret_cast<Object (*)()>(find("PyEval_GetFrame"));
  frame_code = reinterpret_cast<Object (*)(Object)>(find("PyFrame_GetCode"));
  frame_back = reinterpret_cast<Object (*)(Object)>(find("PyFrame_GetBack"));
  frame_line = reinterpret_cast<int (*)(Object)>(find("PyFrame_GetLineNumber"));
  frame_locals = reinterpret_cast<Object (*)(Object)>(find("PyFrame_GetLocals"));
  get_attr = reinterpret_cast<Object (*)(Object, const char*)>(find("PyObject_GetAttrString"));
  mapping_item = reinterpret_cast<Object (*)(Object, const char*)>(find("PyMapping_GetItemString"));
  utf8 = reinterpret_cast<const char* (*)(Object)>(find("PyUnicode_AsUTF8"));
  decref = reinterpret_cast<void (*)(Object)>(find("Py_DecRef"));
  clear_error = reinterpret_cast<void (*)()>(find("PyErr_Clear"));
  sys_object = reinterpret_cast<Object (*)(const char*)>(find("PySys_GetObject"));
  dict_item = reinterpret_cast<Object (*)(Object, const char*)>(find("PyDict_GetItemString"));
  compile = reinterpret_cast<Object (*)(const char*, const char*, int)>(find("Py_CompileString"));
  exec_module = reinterpret_cast<Object (*)(const char*, Object, const char*)>(find("PyImport_ExecCodeModuleEx"));
  set_attr = reinterpret_cast<int (*)(Object, const char*, Object)>(find("PyObject_SetAttrString"));
  bool_from = reinterpret_cast<Object (*)(long)>(find("PyBool_FromLong"));
  call = reinterpret_cast<Object (*)(Object, Object)>(find("PyObject_CallObject"));
  fetch_error = reinterpret_cast<void (*)(Object*, Object*, Object*)>(find("PyErr_Fetch"));
  str = reinterpret_cast<Object (*)(Object)>(find("PyObject_Str"));
  usable = is_initialized && gil_ensure && gil_release && current_frame && frame_code && frame_back && frame_line &&
           get_attr && utf8 && decref && clear_error;
  runs_code = is_initialized && gil_ensure && gil_release && get_attr && utf8 && decref && clear_error && compile &&
              exec_module && set_attr && bool_from && call && fetch_error && str;
}

std::string Python::attribute_text(Object object, const char* name) const {
  Object value = get_attr(object, name);
  if (!value) {
    clear_error();
    return {};
  }
  const char* text = utf8(value);
  std::string result = text ? text : "";
  if (!text) clear_error();
  decref(value);
  return result;
}

std::string Python::take_error() const {
  Object type = nullptr, value = nullptr, traceback = nullptr;
  fetch_error(&type, &value, &traceback);
  std::string text;
  if (type) text = attribute_text(type, "__name__");
  if (value) {
    if (Object message = str(value)) {
      const char* utf = utf8(message);
      if (utf && *utf) text += std::string(": ") + utf;
      decref(message);
    }
  }
  for (Object owned : {type, value, traceback}) {
    if (owned) decref(owned);
  }
  clear_error();
  return text;
}

const Python& python() {
  static const Python instance;
  return instance;
}

}  // namespace attnreplay::capture
