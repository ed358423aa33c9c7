# NVSHMEM (optional, for edges that cross nodes): looked for under GFDIT_NVSHMEM_ROOT (cache or environment),
# NVSHMEM_HOME, and the nvidia-nvshmem-cu13 wheel of the Python environment (site-packages/nvidia/nvshmem;
# torch's CUDA wheels may have put an nvidia-nvshmem-cu12 copy there instead, possibly without every header).
# Only the host library is linked (libnvshmem_host.so.3: puts on streams, bootstrap); it needs no driver
# to load. Included by the top-level CMakeLists.txt after gfdit_cuda is defined; sets GFDIT_NVSHMEM_FOUND.
option(GFDIT_ENABLE_NVSHMEM "Compile NVSHMEM in when it is found" ON)
set(GFDIT_NVSHMEM_ROOT "$ENV{GFDIT_NVSHMEM_ROOT}" CACHE PATH "An NVSHMEM install (include/, lib/)")
set(GFDIT_NVSHMEM_VERSION "")
target_sources(gfdit_cuda PRIVATE ${PROJECT_SOURCE_DIR}/src/collectives/cuda/nvshmem_edges.cpp)
if(GFDIT_ENABLE_NVSHMEM)
  set(_gfdit_nvshmem_roots ${GFDIT_NVSHMEM_ROOT} $ENV{NVSHMEM_HOME})
  find_program(_gfdit_python NAMES python3 python)
  if(_gfdit_python)
    execute_process(COMMAND ${_gfdit_python} -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
      OUTPUT_VARIABLE _gfdit_purelib OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_gfdit_purelib)
      list(APPEND _gfdit_nvshmem_roots "${_gfdit_purelib}/nvidia/nvshmem")
    endif()
  endif()
  find_path(GFDIT_NVSHMEM_INCLUDE_DIR nvshmem_host.h PATHS ${_gfdit_nvshmem_roots} PATH_SUFFIXES include
    NO_DEFAULT_PATH)
  find_library(GFDIT_NVSHMEM_HOST_LIBRARY NAMES nvshmem_host libnvshmem_host.so.3 PATHS ${_gfdit_nvshmem_roots}
    PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  if(GFDIT_NVSHMEM_INCLUDE_DIR AND GFDIT_NVSHMEM_HOST_LIBRARY)
    # The version is only reported (buildFeatures); a copy without the header (another layout, or a wheel
    # that ships part of the headers, as torch's CUDA wheels may pull in) must not stop the configure.
    set(_gfdit_nv_version_h "${GFDIT_NVSHMEM_INCLUDE_DIR}/non_abi/nvshmem_version.h")
    set(GFDIT_NVSHMEM_VERSION "unknown")
    if(EXISTS "${_gfdit_nv_version_h}")
      file(STRINGS "${_gfdit_nv_version_h}" _gfdit_nv_lines REGEX "#define NVSHMEM_VENDOR_(MAJOR|MINOR|PATCH)_VERSION")
      foreach(_part MAJOR MINOR PATCH)
        string(REGEX MATCH "NVSHMEM_VENDOR_${_part}_VERSION +([0-9]+)" _m "${_gfdit_nv_lines}")
        set(_gfdit_nv_${_part} "${CMAKE_MATCH_1}")
      endforeach()
      if(NOT _gfdit_nv_MAJOR STREQUAL "")
        set(GFDIT_NVSHMEM_VERSION "${_gfdit_nv_MAJOR}.${_gfdit_nv_MINOR}.${_gfdit_nv_PATCH}")
      endif()
    else()
      message(STATUS "gfdit: NVSHMEM in ${GFDIT_NVSHMEM_INCLUDE_DIR} has no non_abi/nvshmem_version.h: version "
                     "unknown (a wheel built for another CUDA major may not compile; -DGFDIT_ENABLE_NVSHMEM=OFF)")
    endif()
    get_filename_component(_gfdit_nvshmem_libdir "${GFDIT_NVSHMEM_HOST_LIBRARY}" DIRECTORY)
    target_include_directories(gfdit_cuda PRIVATE "${GFDIT_NVSHMEM_INCLUDE_DIR}")
    target_compile_definitions(gfdit_cuda PRIVATE GFDIT_WITH_NVSHMEM=1
      GFDIT_NVSHMEM_VERSION="${GFDIT_NVSHMEM_VERSION}")
    # The wheel ships libnvshmem_host.so.3 (and the bootstrap plugins it dlopens) in one directory: run
    # paths find it there wherever the environment lives.
    target_link_libraries(gfdit_cuda PUBLIC "${GFDIT_NVSHMEM_HOST_LIBRARY}")
    target_link_options(gfdit_cuda INTERFACE "LINKER:-rpath,${_gfdit_nvshmem_libdir}")
    set(GFDIT_NVSHMEM_FOUND ON)
  endif()
endif()
