# The CUDA backend (core/cuda/, kernels/cuda/): device memory, streams, and
# the kernels behind kernels::X(ctx, ...) for a Backend::cuda context.
# AUTO builds it when nvcc and the CUDA toolkit (cuBLAS, cuBLASLt) are found,
# so every machine with the toolkit compiles and links it in `make test`;
# its tests skip, saying why, where no GPU is visible.
set(MOETRON_CUDA AUTO CACHE STRING "CUDA backend: AUTO (when nvcc is found), ON or OFF")
set_property(CACHE MOETRON_CUDA PROPERTY STRINGS AUTO ON OFF)
if(NOT MOETRON_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "MOETRON_CUDA must be AUTO, ON or OFF, got '${MOETRON_CUDA}'")
endif()
# Hopper (H100/H200) and Ampere (A100): machine code for both, and PTX for
# sm_90 so a newer GPU can still JIT the kernels.
set(MOETRON_CUDA_ARCHITECTURES "80-real;90" CACHE STRING "CUDA architectures of the CUDA backend")

set(MOETRON_HAVE_CUDA OFF)
if(NOT MOETRON_CUDA STREQUAL "OFF")
  # check_language looks on the PATH and at CUDACXX; the toolkit's usual
  # home is not always on the PATH, so name it when nothing else is set.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(MOETRON_NVCC nvcc HINTS ENV CUDA_PATH PATHS /usr/local/cuda/bin NO_CACHE)
    if(MOETRON_NVCC)
      set(CMAKE_CUDA_COMPILER ${MOETRON_NVCC})
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${MOETRON_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(MOETRON_HAVE_CUDA ON)
  elseif(MOETRON_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MOETRON_CUDA=ON but no CUDA compiler (nvcc) was found; set CUDACXX or "
                        "CMAKE_CUDA_COMPILER, or configure with -DMOETRON_CUDA=OFF")
  endif()
endif()

if(MOETRON_HAVE_CUDA)
  # C++20 as for the host code. CMake 3.25 knows no C++20 flag for nvcc (it
  # predates nvcc 12), so targets that also require cxx_std_17 (toml++) fail
  # to generate; nvcc 12+ takes -std=c++20.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION
     AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  set(cu "$<COMPILE_LANGUAGE:CUDA>")
  # Host code in .cu files gets the host warnings; device code nvcc's own.
  add_compile_options("$<${cu}:-Xcompiler=-Wall,-Wextra>")
  if(MOETRON_WERROR)
    add_compile_options("$<${cu}:-Xcompiler=-Werror;--Werror=all-warnings>")
  endif()
endif()
if(MOETRON_HAVE_CUDA)
  message(STATUS "moetron: CUDA backend ON (MOETRON_CUDA=${MOETRON_CUDA}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES})")
else()
  message(STATUS "moetron: CUDA backend OFF (MOETRON_CUDA=${MOETRON_CUDA})")
endif()
