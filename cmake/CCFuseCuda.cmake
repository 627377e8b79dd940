# CUDA toolchain, NCCL (>= 2.28 with device headers) and CUTLASS discovery for ccfuse.
# NOTE: built for sm_90a only: wgmma/setmaxnreg need the arch-specific target (DESIGN §3).
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES OFF)
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CCFUSE_CUDA_GENCODE "-gencode=arch=compute_90a,code=sm_90a" CACHE STRING "nvcc -gencode flags")
string(APPEND CMAKE_CUDA_FLAGS " ${CCFUSE_CUDA_GENCODE} --expt-relaxed-constexpr -Xcompiler=-Wall")
set(CMAKE_CUDA_RUNTIME_LIBRARY Static)

# --- NCCL: CCFUSE_NCCL_ROOT, then the CUDA toolkit directory, then the system, then PyTorch's wheel.
set(CCFUSE_NCCL_ROOT "" CACHE PATH "Directory holding include/nccl.h and lib/libnccl.so")
set(_nccl_hints ${CCFUSE_NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda /usr)
execute_process(COMMAND python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))"
                OUTPUT_VARIABLE _nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(_nccl_wheel)
  list(APPEND _nccl_hints ${_nccl_wheel})
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include REQUIRED)
if(NOT EXISTS ${NCCL_INCLUDE_DIR}/nccl_device.h)
  message(FATAL_ERROR "ccfuse needs the NCCL device API headers (nccl_device.h, NCCL >= 2.28); "
                      "found only ${NCCL_INCLUDE_DIR}/nccl.h. Set CCFUSE_NCCL_ROOT.")
endif()
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu REQUIRED)
file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_code REGEX "#define NCCL_VERSION_CODE [0-9]+")
string(REGEX MATCH "[0-9]+" NCCL_VERSION_CODE "${_nccl_code}")
if(NCCL_VERSION_CODE LESS 22800)
  message(FATAL_ERROR "ccfuse needs NCCL >= 2.28 (found version code ${NCCL_VERSION_CODE} in ${NCCL_INCLUDE_DIR})")
endif()
message(STATUS "ccfuse: NCCL ${NCCL_VERSION_CODE} headers ${NCCL_INCLUDE_DIR}, library ${NCCL_LIBRARY}")
add_library(ccfuse::nccl INTERFACE IMPORTED)
target_include_directories(ccfuse::nccl INTERFACE ${NCCL_INCLUDE_DIR})
target_link_libraries(ccfuse::nccl INTERFACE ${NCCL_LIBRARY})

# --- CUTLASS / CuTe headers from the pinned nvidia-cutlass PyPI package (no network at build time).
set(CCFUSE_CUTLASS_VERSION "4.2.0.0")
set(CCFUSE_CUTLASS_INCLUDE "" CACHE PATH "Directory holding cutlass/cutlass.h and cute/ (default: the nvidia-cutlass package)")
# The interpreter that has it: scikit-build-core's (a wheel build's isolated environment), else python3.
set(_ccfuse_python python3)
if(Python_EXECUTABLE)
  set(_ccfuse_python ${Python_EXECUTABLE})
elseif(Python3_EXECUTABLE)
  set(_ccfuse_python ${Python3_EXECUTABLE})
endif()
if(NOT CCFUSE_CUTLASS_INCLUDE)
  execute_process(COMMAND ${_ccfuse_python} -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
                  OUTPUT_VARIABLE _cutlass_inc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(_cutlass_inc AND EXISTS ${_cutlass_inc}/cutlass/cutlass.h)
    set(CCFUSE_CUTLASS_INCLUDE ${_cutlass_inc} CACHE PATH "" FORCE)
  endif()
endif()
if(CCFUSE_CUTLASS_INCLUDE AND EXISTS ${CCFUSE_CUTLASS_INCLUDE}/cute/tensor.hpp)
  message(STATUS "ccfuse: CUTLASS/CuTe headers ${CCFUSE_CUTLASS_INCLUDE} (pinned nvidia-cutlass==${CCFUSE_CUTLASS_VERSION})")
  add_library(ccfuse::cutlass INTERFACE IMPORTED)
  target_include_directories(ccfuse::cutlass SYSTEM INTERFACE ${CCFUSE_CUTLASS_INCLUDE})
  # wgmma's N in steps of 8 (CuTe's selector otherwise knows 8-32 and multiples of 32 to 256 in
  # a few steps): the 128x160 and 128x224 tiles need n160 and n224 (one instruction per k-step,
  # not 5 or 7 of n32). The shapes it already knew select the same instruction either way.
  target_compile_definitions(ccfuse::cutlass INTERFACE CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED)
else()
  message(FATAL_ERROR "ccfuse: CUTLASS headers not found: pip install nvidia-cutlass==${CCFUSE_CUTLASS_VERSION} "
                      "(tools/setup.sh does) or set CCFUSE_CUTLASS_INCLUDE")
endif()
