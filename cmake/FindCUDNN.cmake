# FindCUDNN: locates cuDNN 9 headers and the main library.
# Honours CUDNN_ROOT (cache or environment variable), then the CUDA toolkit folder,
# then the system locations Debian/Ubuntu use (/usr/include/x86_64-linux-gnu on the GPU host).
# Defines CUDNN::cudnn, CUDNN_FOUND, CUDNN_VERSION, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY.
set(_cudnn_hints "")
if(CUDNN_ROOT)
  list(APPEND _cudnn_hints "${CUDNN_ROOT}")
endif()
if(DEFINED ENV{CUDNN_ROOT})
  list(APPEND _cudnn_hints "$ENV{CUDNN_ROOT}")
endif()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _cudnn_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
list(APPEND _cudnn_hints /usr/local/cuda /usr)

find_path(CUDNN_INCLUDE_DIR cudnn_version.h
  HINTS ${_cudnn_hints}
  PATH_SUFFIXES include include/x86_64-linux-gnu include/aarch64-linux-gnu)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
  HINTS ${_cudnn_hints}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu lib/aarch64-linux-gnu)

if(CUDNN_INCLUDE_DIR AND EXISTS "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_v REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
  string(REGEX REPLACE ".*CUDNN_MAJOR +([0-9]+).*" "\\1" _maj "${_cudnn_v}")
  string(REGEX REPLACE ".*CUDNN_MINOR +([0-9]+).*" "\\1" _min "${_cudnn_v}")
  string(REGEX REPLACE ".*CUDNN_PATCHLEVEL +([0-9]+).*" "\\1" _pat "${_cudnn_v}")
  set(CUDNN_VERSION "${_maj}.${_min}.${_pat}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
