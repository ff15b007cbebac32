# stdexec (P2300, std::execution) for <metronome/execution.hpp>: optional. When found,
# the INTERFACE target metronome::execution (metronome plus stdexec's headers) exists and
# METRONOME_HAS_STDEXEC is ON; otherwise one status line says why it was skipped, and the
# rest of the build is unchanged.
#   METRONOME_STDEXEC_INCLUDE_DIR  a folder holding stdexec/execution.hpp (the project's
#                                  presets point it at ../shared/stdexec/include);
#   else find_package(stdexec)     an installed stdexec (its target STDEXEC::stdexec).
# stdexec needs g++ 12 or clang 16 (clang 14 cannot parse its headers).
set(METRONOME_STDEXEC_INCLUDE_DIR "" CACHE PATH "stdexec's include folder (empty: find_package(stdexec))")
set(METRONOME_HAS_STDEXEC OFF)
set(_metronome_stdexec_why "")
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 16)
  set(_metronome_stdexec_why "stdexec needs clang 16 or later (this is clang ${CMAKE_CXX_COMPILER_VERSION})")
elseif(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 12)
  set(_metronome_stdexec_why "stdexec needs g++ 12 or later")
elseif(METRONOME_STDEXEC_INCLUDE_DIR)
  if(EXISTS "${METRONOME_STDEXEC_INCLUDE_DIR}/stdexec/execution.hpp")
    add_library(metronome_stdexec INTERFACE)
    target_include_directories(metronome_stdexec SYSTEM INTERFACE "${METRONOME_STDEXEC_INCLUDE_DIR}")
    set(METRONOME_HAS_STDEXEC ON)
  else()
    set(_metronome_stdexec_why "no stdexec/execution.hpp under METRONOME_STDEXEC_INCLUDE_DIR=${METRONOME_STDEXEC_INCLUDE_DIR}")
  endif()
else()
  find_package(stdexec QUIET)
  if(TARGET STDEXEC::stdexec)
    add_library(metronome_stdexec INTERFACE)
    target_link_libraries(metronome_stdexec INTERFACE STDEXEC::stdexec)
    set(METRONOME_HAS_STDEXEC ON)
  else()
    set(_metronome_stdexec_why "find_package(stdexec) found none (set METRONOME_STDEXEC_INCLUDE_DIR or stdexec_DIR)")
  endif()
endif()
if(METRONOME_HAS_STDEXEC)
  add_library(metronome_execution INTERFACE)
  add_library(metronome::execution ALIAS metronome_execution)
  target_link_libraries(metronome_execution INTERFACE metronome::metronome metronome_stdexec)
  message(STATUS "metronome: std::execution support (metronome/execution.hpp) with stdexec")
else()
  message(STATUS "metronome: std::execution support skipped: ${_metronome_stdexec_why}")
endif()
