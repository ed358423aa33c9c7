// The CUDA side of gfdit (the gfdit::cuda library, built where nvcc is found).
#pragma once

namespace gfdit {
namespace cuda {

/// Makes the CUDA transport available to World::create (WorldOptions::device >= 0): collectives on device
/// pointers, enqueued on a stream. Idempotent; the Python module calls it on import.
void enable();

}  // namespace cuda
}  // namespace gfdit
