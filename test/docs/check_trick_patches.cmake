# Every speed trick scripts/tricks.sh measures is taken out by a patch under
# bench/tricks/; a patch that no longer applies stops that script. Fails naming each
# patch that does not apply to the tree as it is, so that none goes stale unseen.
#
# Usage: cmake -DSOURCE_DIR=<repository> -DPATCH=<patch program> -P check_trick_patches.cmake

cmake_minimum_required(VERSION 3.20)
if(NOT SOURCE_DIR OR NOT PATCH)
  message(FATAL_ERROR "SOURCE_DIR and PATCH must be set")
endif()

file(GLOB patches LIST_DIRECTORIES false "${SOURCE_DIR}/bench/tricks/*.patch")
if(NOT patches)
  message(FATAL_ERROR "no patch found under ${SOURCE_DIR}/bench/tricks")
endif()
set(failures 0)
foreach(p IN LISTS patches)
  execute_process(COMMAND "${PATCH}" -p1 --dry-run -s -f -d "${SOURCE_DIR}" -i "${p}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  file(RELATIVE_PATH name "${SOURCE_DIR}" "${p}")
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "${name} no longer applies (update it with the code it takes out):\n${out}${err}")
    math(EXPR failures "${failures} + 1")
  endif()
endforeach()
list(LENGTH patches n)
if(failures EQUAL 0)
  message(STATUS "${n} trick patches apply")
endif()
