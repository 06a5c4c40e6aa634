# The CUDA backend: added to the kvtier target when a CUDA compiler is found
# (KVTIER_WITH_CUDA=AUTO) or asked for (ON). Included from the top-level CMakeLists.txt after
# the kvtier target exists.
#
# Device code is built for Hopper only (sm_90 machine code, no PTX) with --fmad=false: the
# codecs in kernels/ must round exactly as the host compiler does. The CUDA runtime is linked
# statically and libcuda never: driver functions are looked up at run time
# (src/cuda/cuda_status.cc), so every binary loads, and the GPU tests skip, where there is no
# driver or device.

set(KVTIER_CUDA_ARCHITECTURES "90-real" CACHE STRING
    "CUDA architectures of kvtier's kernels (the backend accepts sm_90 devices only)")
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES ${KVTIER_CUDA_ARCHITECTURES})
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)

# Directory-wide options (-Wall -Wextra, sanitizers) are host-compiler flags: keep them off
# nvcc's command line, which rejects them, and hand the warnings to the host compiler instead.
function(kvtier_cuda_target target)
  get_target_property(options ${target} COMPILE_OPTIONS)
  if(options)
    set(cxx_only)
    foreach(option IN LISTS options)
      list(APPEND cxx_only "$<$<COMPILE_LANGUAGE:CXX>:${option}>")
    endforeach()
    set_target_properties(${target} PROPERTIES COMPILE_OPTIONS "${cxx_only}")
  endif()
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${KVTIER_CUDA_ARCHITECTURES}")
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -lineinfo -Xcompiler=-Wall>)
endfunction()

target_sources(kvtier PRIVATE
  kernels/append.cu
  kernels/attention/decode_launch.cu
  kernels/attention/logits.cu
  kernels/attention/merge_states.cu
  kernels/attention/page_weight.cu
  kernels/copy_pages.cu
  kernels/migrate.cu
  kernels/read_page.cu
  kernels/rotate.cu
  kernels/self_check.cu
  src/cuda/cuda_append_step.cc
  src/cuda/cuda_backend.cc
  src/cuda/cuda_data_plane.cc
  src/cuda/cuda_host_tier.cc
  src/cuda/cuda_decode_attention.cc
  src/cuda/cuda_status.cc
)
kvtier_cuda_target(kvtier)
target_compile_definitions(kvtier PRIVATE KVTIER_WITH_CUDA=1)
target_link_libraries(kvtier PRIVATE $<BUILD_INTERFACE:CUDA::cudart_static>)
get_target_property(_kvtier_type kvtier TYPE)
if(_kvtier_type STREQUAL "STATIC_LIBRARY")
  # Programs linking the installed static library need the runtime too, through the CMake
  # package and the pkg-config file alike. (A shared libkvtier carries it inside.) Named by path
  # so that the installed package needs no CUDAToolkit.
  foreach(_lib IN ITEMS "${CUDA_cudart_static_LIBRARY}" ${CMAKE_DL_LIBS} rt pthread)
    target_link_libraries(kvtier INTERFACE "$<INSTALL_INTERFACE:${_lib}>")
    if(IS_ABSOLUTE "${_lib}")
      string(APPEND KVTIER_PC_LIBS_CUDA " ${_lib}")
    else()
      string(APPEND KVTIER_PC_LIBS_CUDA " -l${_lib}")
    endif()
  endforeach()
endif()

if(KVTIER_BUILD_TESTS)
  enable_testing()
  find_package(GTest REQUIRED)
  include(GoogleTest)
  add_executable(kvtier_gpu_tests
    tests/gpu/cuda_backend_test.cc
    tests/gpu/cuda_oom_test.cc
    tests/gpu/cuda_parity_test.cc
    tests/gpu/cuda_stress_test.cc
    tests/gpu/decode_attention_test.cc
    tests/gpu/host_tier_gpu_test.cc
    tests/gpu/prepared_append_gpu_test.cc
  )
  kvtier_cuda_target(kvtier_gpu_tests)
  target_include_directories(kvtier_gpu_tests PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(kvtier_gpu_tests PRIVATE
    kvtier CUDA::cudart_static GTest::gtest GTest::gtest_main)
  # Skips (and passes) where no GPU is visible, as in CI.
  gtest_discover_tests(kvtier_gpu_tests DISCOVERY_TIMEOUT 60 PROPERTIES LABELS gpu)

  # Copy roof, migration and append bandwidth on the GPU; writes JSON (docs/gpu.md).
  add_executable(kvtier_gpu_bench tests/bench/gpu_bench.cu)
  kvtier_cuda_target(kvtier_gpu_bench)
  set_target_properties(kvtier_gpu_bench PROPERTIES LINKER_LANGUAGE CXX)
  target_include_directories(kvtier_gpu_bench PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(kvtier_gpu_bench PRIVATE kvtier CUDA::cudart_static)

  # Host-tier offload and onload bandwidth against the pinned copy roof (docs/tiers.md).
  add_executable(kvtier_tier_bench tests/bench/tier_bench.cc)
  target_link_libraries(kvtier_tier_bench PRIVATE kvtier CUDA::cudart_static)
endif()
