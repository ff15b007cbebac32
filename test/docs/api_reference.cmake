# Builds the API reference (docs/Doxyfile: the public headers' comments) into
# WORK_DIR/api/html with warnings as errors: an undocumented public name, or a comment
# doxygen cannot read, fails the test.
file(READ ${SOURCE_DIR}/docs/Doxyfile config)
file(MAKE_DIRECTORY ${WORK_DIR}/api)
file(WRITE ${WORK_DIR}/Doxyfile "${config}\nOUTPUT_DIRECTORY = ${WORK_DIR}/api\n")
execute_process(COMMAND ${DOXYGEN} ${WORK_DIR}/Doxyfile WORKING_DIRECTORY ${SOURCE_DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc OR err MATCHES "warning|error")
  message(FATAL_ERROR "doxygen (${rc}):\n${err}")
endif()
message(STATUS "API reference: ${WORK_DIR}/api/html/index.html")
