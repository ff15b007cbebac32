# Installs the build tree into a scratch prefix, then configures, builds and runs
# the consumer project against it with find_package(metronome CONFIG).
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/test/install -B ${WORK_DIR}/build -G ${GENERATOR}
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_CXX_COMPILER=${CXX_COMPILER} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
                        -DEXPECT_STANDALONE_ASIO=${STANDALONE_ASIO} "-DSTDEXEC_INCLUDE_DIR=${STDEXEC_INCLUDE_DIR}"
                        RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer configure failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer build failed: ${rc}")
endif()
execute_process(COMMAND ${WORK_DIR}/build/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "consumer run failed: ${rc}")
endif()
if(STDEXEC_INCLUDE_DIR)
  execute_process(COMMAND ${WORK_DIR}/build/consumer_execution RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "consumer_execution run failed: ${rc}")
  endif()
  message(STATUS "consumer_execution built with metronome::execution and ran")
endif()
message(STATUS "consumer built against the installed metronome and ran")
