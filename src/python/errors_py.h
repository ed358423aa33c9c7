// What other bindings need of the error classes: which gfdit::ErrorCode a Python exception stands for.
#pragma once

#include <pybind11/pybind11.h>

#include "gfdit/error.h"

namespace gfdit {
namespace python {

/// The code of a gfdit exception by its class (RemoteError, Timeout, InvalidUsage, SystemError); kInternal for a
/// plain gfdit.Error and for any other exception.
ErrorCode errorCodeOf(const pybind11::handle& exc);

}  // namespace python
}  // namespace gfdit
