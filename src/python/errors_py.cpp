// gfdit::Error codes become Python classes: Error, InvalidUsage(Error, ValueError),
// Timeout(Error, TimeoutError), RemoteError(Timeout), SystemError_(Error, OSError).
#include "bindings.h"
#include "gfdit/error.h"

namespace py = pybind11;

namespace gfdit {
namespace python {
namespace {

PyObject* newClass(py::module_& m, const char* name, PyObject* bases) {
  std::string full = std::string("gfdit._C.") + name;
  PyObject* cls = PyErr_NewException(full.c_str(), bases, nullptr);
  if (cls == nullptr) throw py::error_already_set();
  m.attr(name) = py::handle(cls);
  return cls;
}

PyObject* g_error = nullptr;
PyObject* g_invalid = nullptr;
PyObject* g_timeout = nullptr;
PyObject* g_remote = nullptr;
PyObject* g_system = nullptr;

}  // namespace

void register_errors(py::module_& m) {
  g_error = newClass(m, "Error", PyExc_RuntimeError);
  g_invalid = newClass(m, "InvalidUsage", py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError)).ptr());
  g_timeout = newClass(m, "Timeout", py::make_tuple(py::handle(g_error), py::handle(PyExc_TimeoutError)).ptr());
  g_remote = newClass(m, "RemoteError", py::make_tuple(py::handle(g_timeout)).ptr());
  g_system = newClass(m, "SystemError", py::make_tuple(py::handle(g_error), py::handle(PyExc_OSError)).ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* cls = g_error;
      switch (e.code()) {
        case ErrorCode::kInvalidUsage: cls = g_invalid; break;
        case ErrorCode::kTimeout: cls = g_timeout; break;
        case ErrorCode::kRemoteError: cls = g_remote; break;
        case ErrorCode::kSystemError: cls = g_system; break;
        case ErrorCode::kInternal: cls = g_error; break;
      }
      PyErr_SetString(cls, e.what());
    }
  });
}

}  // namespace python
}  // namespace gfdit
