# The Python module `kvtier` (adapters/python/, entry point module.cc) with Debian's pybind11,
# and its pytest suite registered with ctest (label "python"). Included from the top-level
# CMakeLists.
#
# KVTIER_BUILD_PYTHON defaults to ON when pybind11 is found and no sanitizer is set (an
# ASan/TSan module cannot be loaded into a plain python3). The module and its tests use Debian's
# /usr/bin/python3 (where python3-numpy and python3-pytest live) unless PYTHON_EXECUTABLE is
# given: another python3 earlier in PATH (pyenv) would otherwise be picked.
if(NOT DEFINED PYTHON_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(PYTHON_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "The Python the kvtier module is built for")
endif()
find_package(pybind11 CONFIG QUIET)
set(kvtier_python_default OFF)
if(pybind11_FOUND AND NOT KVTIER_SANITIZE)
  set(kvtier_python_default ON)
endif()
option(KVTIER_BUILD_PYTHON "Build the Python module kvtier (needs pybind11)" ${kvtier_python_default})

if(KVTIER_BUILD_PYTHON)
  if(NOT pybind11_FOUND)
    message(FATAL_ERROR "KVTIER_BUILD_PYTHON needs pybind11 (Debian: pybind11-dev python3-dev)")
  endif()
  pybind11_add_module(kvtier_py
    adapters/python/adapter_bindings.cc
    adapters/python/append_bindings.cc
    adapters/python/attention_bindings.cc
    adapters/python/cache_bindings.cc
    adapters/python/dlpack.cc
    adapters/python/module.cc
    adapters/python/py_support.cc
    adapters/python/tensor_args.cc
    adapters/python/value_bindings.cc
  )
  set_target_properties(kvtier_py PROPERTIES OUTPUT_NAME kvtier
    LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/python)
  target_include_directories(kvtier_py PRIVATE ${PROJECT_SOURCE_DIR})
  target_link_libraries(kvtier_py PRIVATE kvtier)
  if(KVTIER_BUILD_TESTS)
    add_test(NAME python_tests
      COMMAND ${PYTHON_EXECUTABLE} -m pytest -q -p no:cacheprovider ${PROJECT_SOURCE_DIR}/tests/python)
    set_tests_properties(python_tests PROPERTIES LABELS python TIMEOUT 300
      ENVIRONMENT "PYTHONPATH=${PROJECT_BINARY_DIR}/python;KVTIER_PYTHON_REQUIRED=1")
  endif()
endif()
