# Whether to build the Python module cpsim._cpsim (python/): CPSIM_BUILD_PYTHON AUTO builds it where
# a Python with its headers and nanobind is found (the project's .venv, or Python_EXECUTABLE), never
# under sanitizers or fuzzers (an instrumented module cannot load into a plain interpreter); ON
# requires it. Sets CPSIM_HAVE_PYTHON, and position-independent code for every library it links.
set(CPSIM_HAVE_PYTHON OFF)
if(CPSIM_BUILD_PYTHON STREQUAL "OFF" OR
   (CPSIM_BUILD_PYTHON STREQUAL "AUTO" AND (CPSIM_SANITIZE OR CPSIM_BUILD_FUZZERS)))
  return()
endif()
if(NOT DEFINED Python_EXECUTABLE AND EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python)
  set(Python_EXECUTABLE ${PROJECT_SOURCE_DIR}/.venv/bin/python)
endif()
if(CPSIM_BUILD_PYTHON STREQUAL "ON")
  find_package(Python 3.11 COMPONENTS Interpreter Development.Module REQUIRED)
else()
  find_package(Python 3.11 COMPONENTS Interpreter Development.Module)
  if(NOT Python_FOUND)
    return()
  endif()
endif()
execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
                OUTPUT_VARIABLE nanobind_ROOT OUTPUT_STRIP_TRAILING_WHITESPACE
                RESULT_VARIABLE nanobind_missing ERROR_QUIET)
if(nanobind_missing)
  if(CPSIM_BUILD_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "CPSIM_BUILD_PYTHON=ON: nanobind is not installed for ${Python_EXECUTABLE}")
  endif()
  return()
endif()
find_package(nanobind CONFIG REQUIRED)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
set(CPSIM_HAVE_PYTHON ON)
