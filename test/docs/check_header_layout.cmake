# The layout rule of docs/design.md (Source layout): a public header
# (include/metronome/*.hpp, not detail/ or impl/) holds its concept's declarations and
# their doc comments, its long template bodies live in impl/<header>.hpp, and it stays
# within 250 lines. Fails naming every public header over the limit.
#
# Usage: cmake -DSOURCE_DIR=<repository> -P check_header_layout.cmake

cmake_minimum_required(VERSION 3.20)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "SOURCE_DIR is not set")
endif()

set(max_lines 250)
file(GLOB headers LIST_DIRECTORIES false "${SOURCE_DIR}/include/metronome/*.hpp")
if(NOT headers)
  message(FATAL_ERROR "no public header found under ${SOURCE_DIR}/include/metronome")
endif()

set(failures 0)
foreach(header IN LISTS headers)
  # file(STRINGS) drops empty lines: count newlines instead, as `wc -l` does.
  file(READ "${header}" text)
  string(REGEX REPLACE "[^\n]" "" newlines "${text}")
  string(LENGTH "${newlines}" count)
  file(RELATIVE_PATH name "${SOURCE_DIR}" "${header}")
  if(count GREATER max_lines)
    message(SEND_ERROR "${name}: ${count} lines, over ${max_lines}: move its template bodies and "
                       "the detail:: helpers only it uses to include/metronome/impl/ (see docs/design.md)")
    math(EXPR failures "${failures} + 1")
  endif()
endforeach()

list(LENGTH headers checked)
if(failures GREATER 0)
  message(FATAL_ERROR "${failures} of ${checked} public headers over ${max_lines} lines")
endif()
message(STATUS "${checked} public headers, none over ${max_lines} lines")
