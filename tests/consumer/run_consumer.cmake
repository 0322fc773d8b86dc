# ctest driver: install ditto from DITTO_BUILD_DIR into a scratch prefix, then configure,
# build and run the consumer project against it.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
function(run_step)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  message("${out}")
endfunction()
run_step(${CMAKE_COMMAND} --install "${DITTO_BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
run_step(${CMAKE_COMMAND} -S "${CONSUMER_SRC}" -B "${WORK_DIR}/build" -G "${CMAKE_GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
run_step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run_step("${WORK_DIR}/build/consumer")
