# Every test case the documents cite exists.
#
# Citation syntax, in README.md and docs/*.md: a line containing `Tested by:` (with or
# without emphasis, e.g. `- *Tested by:*`) opens a citation that runs to the end of its
# paragraph or list item (a blank line, the next list item or a heading). Every
# backticked lower_snake_case name in it is a test case name: a Boost.Test case
# (`BOOST_AUTO_TEST_CASE(name)`, `BOOST_FIXTURE_TEST_CASE(name, ...)`, ...) or a case of a
# plain test program (a function `int name()` at the start of a line), under test/.
# File names (with a dot) and other backticked text in the citation are ignored.
#
# A line containing `Hook:` names test hooks: each backticked name on it must be in
# include/ or src/.
#
# Outside citations, a backticked lower_snake_case name of six words or more is taken
# for a test case name too unless it names something in include/, src/ or bench/: it
# must exist, so that a test name cited in prose cannot go stale either.
#
# Usage: cmake -DSOURCE_DIR=<repository> -P check_test_citations.cmake

cmake_minimum_required(VERSION 3.20)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "SOURCE_DIR is not set")
endif()

# The test cases.
file(GLOB_RECURSE test_sources "${SOURCE_DIR}/test/*.cpp" "${SOURCE_DIR}/test/*.hpp")
set(cases "")
foreach(f IN LISTS test_sources)
  file(READ "${f}" content)
  string(REGEX MATCHALL "TEST_CASE[A-Z_]*\\([ \t\r\n]*[A-Za-z0-9_]+" found "${content}")
  foreach(m IN LISTS found)
    string(REGEX REPLACE "^.*\\([ \t\r\n]*" "" m "${m}")
    list(APPEND cases "${m}")
  endforeach()
  string(REGEX MATCHALL "\nint [a-z0-9_]+\\(\\)" found "${content}")
  foreach(m IN LISTS found)
    string(REGEX REPLACE "^\nint ([a-z0-9_]+)\\(\\)$" "\\1" m "${m}")
    list(APPEND cases "${m}")
  endforeach()
endforeach()
list(REMOVE_DUPLICATES cases)
list(LENGTH cases case_count)
if(case_count LESS 50)
  message(FATAL_ERROR "found only ${case_count} test cases under ${SOURCE_DIR}/test: the pattern is out of date")
endif()

# The product's own text, for long names that are not test cases.
file(GLOB_RECURSE product_sources "${SOURCE_DIR}/include/*.hpp" "${SOURCE_DIR}/src/*.cpp"
     "${SOURCE_DIR}/src/*.hpp" "${SOURCE_DIR}/bench/*.cpp" "${SOURCE_DIR}/bench/*.hpp")
set(product "")
foreach(f IN LISTS product_sources)
  file(READ "${f}" content)
  string(APPEND product "${content}")
endforeach()

file(GLOB docs "${SOURCE_DIR}/docs/*.md")
list(PREPEND docs "${SOURCE_DIR}/README.md")
set(checked 0)
set(missing 0)
foreach(doc IN LISTS docs)
  file(RELATIVE_PATH doc_name "${SOURCE_DIR}" "${doc}")
  file(READ "${doc}" text)
  string(REPLACE "\\" "<BS>" text "${text}")
  string(REPLACE ";" "<SC>" text "${text}")
  string(REPLACE "[" "<LB>" text "${text}")
  string(REPLACE "]" "<RB>" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(in_citation FALSE)
  set(line_no 0)
  foreach(line IN LISTS lines)
    math(EXPR line_no "${line_no} + 1")
    string(STRIP "${line}" stripped)
    if(stripped STREQUAL "" OR stripped MATCHES "^#")
      set(in_citation FALSE)
    elseif(stripped MATCHES "^[-*] " AND NOT stripped MATCHES "^[-*] +[*_]*Tested by:")
      set(in_citation FALSE)
    endif()
    set(span "")
    if(line MATCHES "Tested by:(.*)$")
      set(in_citation TRUE)
      set(span "${CMAKE_MATCH_1}")
    elseif(in_citation)
      set(span "${line}")
    endif()
    # Citations.
    string(REGEX MATCHALL "`[a-z][a-z0-9_]*`" names "${span}")
    foreach(n IN LISTS names)
      string(REPLACE "`" "" n "${n}")
      math(EXPR checked "${checked} + 1")
      if(NOT n IN_LIST cases)
        message(SEND_ERROR "${doc_name}:${line_no}: cites test case '${n}', which is not in test/")
        math(EXPR missing "${missing} + 1")
      endif()
    endforeach()
    # Test hooks named on a `Hook:` line exist in the product.
    if(line MATCHES "Hook:(.*)$")
      string(REGEX MATCHALL "`[a-z][a-z0-9_]*`" names "${CMAKE_MATCH_1}")
      foreach(n IN LISTS names)
        string(REPLACE "`" "" n "${n}")
        string(FIND "${product}" "${n}" at)
        if(at EQUAL -1)
          message(SEND_ERROR "${doc_name}:${line_no}: names test hook '${n}', which is not in include/ or src/")
          math(EXPR missing "${missing} + 1")
        endif()
      endforeach()
    endif()
    # Long names anywhere else.
    if(span STREQUAL "")
      string(REGEX MATCHALL "`[a-z][a-z0-9]*(_[a-z0-9]+)(_[a-z0-9]+)(_[a-z0-9]+)(_[a-z0-9]+)(_[a-z0-9]+)[a-z0-9_]*`" names "${line}")
      foreach(n IN LISTS names)
        string(REPLACE "`" "" n "${n}")
        if(n IN_LIST cases)
          math(EXPR checked "${checked} + 1")
          continue()
        endif()
        string(FIND "${product}" "${n}" at)
        if(at EQUAL -1)
          message(SEND_ERROR "${doc_name}:${line_no}: '${n}' looks like a test case name but is neither in test/ "
                             "nor in include/, src/ or bench/")
          math(EXPR missing "${missing} + 1")
        endif()
      endforeach()
    endif()
  endforeach()
endforeach()
message(STATUS "${checked} test case citations checked against ${case_count} test cases; ${missing} missing")
