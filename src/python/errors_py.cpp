// gfdit::Error codes become Python classes: Error, InvalidUsage(Error, ValueError),
// Timeout(Error, TimeoutError), RemoteError(Timeout), SystemError_(Error, OSError).
//
// Every instance has `message` (for people, without where it was raised), `param` (the argument or request
// field it is about, or None) and `where` (the C++ check that raised it, or None); str() is the whole text.
// Python code raises them the same way: InvalidUsage("height 33 is not a multiple of 16", param="height").
#include "errors_py.h"

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

py::object noneIfEmpty(const std::string& s) { return s.empty() ? py::object(py::none()) : py::object(py::str(s)); }

}  // namespace

ErrorCode errorCodeOf(const py::handle& exc) {
  auto is = [&](PyObject* cls) { return PyObject_IsInstance(exc.ptr(), cls) == 1; };
  if (is(g_remote)) return ErrorCode::kRemoteError;  // before Timeout: RemoteError is one
  if (is(g_timeout)) return ErrorCode::kTimeout;
  if (is(g_invalid)) return ErrorCode::kInvalidUsage;
  if (is(g_system)) return ErrorCode::kSystemError;
  return ErrorCode::kInternal;  // a gfdit.Error without a subclass, or any other exception
}

void register_errors(py::module_& m) {
  g_error = newClass(m, "Error", PyExc_RuntimeError);
  g_invalid = newClass(m, "InvalidUsage", py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError)).ptr());
  g_timeout = newClass(m, "Timeout", py::make_tuple(py::handle(g_error), py::handle(PyExc_TimeoutError)).ptr());
  g_remote = newClass(m, "RemoteError", py::make_tuple(py::handle(g_timeout)).ptr());
  g_system = newClass(m, "SystemError", py::make_tuple(py::handle(g_error), py::handle(PyExc_OSError)).ptr());
  py::handle error(g_error);
  // One __init__ for the family: the message as the exception's one argument (so it pickles as usual and
  // str() is the message), and the attributes.
  error.attr("__init__") = py::cpp_function(
      [](py::handle self, py::object message, py::object param, py::object where) {
        py::module_::import("builtins").attr("BaseException").attr("__init__")(self, message);
        self.attr("message") = message;
        self.attr("param") = param;
        self.attr("where") = where;
      },
      py::is_method(error), py::arg("message") = py::str(""), py::kw_only(), py::arg("param") = py::none(),
      py::arg("where") = py::none());
  error.attr("param") = py::none();  // instances made without __init__ (unpickled) still have them
  error.attr("where") = py::none();
  error.attr("message") = py::str("");
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
      py::object exc = py::reinterpret_borrow<py::object>(cls)(
          py::str(e.what()), py::arg("param") = noneIfEmpty(e.param()), py::arg("where") = noneIfEmpty(e.where()));
      exc.attr("message") = py::str(e.message());
      PyErr_SetObject(cls, exc.ptr());
    }
  });
}

}  // namespace python
}  // namespace gfdit
