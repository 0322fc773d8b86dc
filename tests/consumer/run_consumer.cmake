# ctest driver: install ditto from DITTO_BUILD_DIR into a scratch prefix, check that the installed
# headers are exactly the public ones (each named by an umbrella header, no internal header),
# then configure, build and run the consumer project against the prefix alone.
cmake_minimum_required(VERSION 3.24)  # IN_LIST below
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

set(inc "${WORK_DIR}/prefix/include/ditto")
foreach(umbrella ditto.h experiments.h)
  if(NOT EXISTS "${inc}/${umbrella}")
    message(FATAL_ERROR "the umbrella header ${inc}/${umbrella} was not installed")
  endif()
endforeach()
file(STRINGS "${inc}/ditto.h" named REGEX "^#include \"")
file(STRINGS "${inc}/experiments.h" named_exp REGEX "^#include \"")
list(APPEND named ${named_exp})
file(GLOB_RECURSE installed RELATIVE "${inc}" "${inc}/*.h")
list(REMOVE_ITEM installed ditto.h experiments.h)
foreach(h IN LISTS installed)
  if(h MATCHES "(^|/)detail/|_ref\\.h$|/check\\.h$|cli\\.h$")
    message(FATAL_ERROR "internal header installed: include/ditto/${h}")
  endif()
  if(NOT "#include \"${h}\"" IN_LIST named)
    message(FATAL_ERROR "include/ditto/${h} is installed but no umbrella header includes it: add it to "
                        "include/ditto/ditto.h or experiments.h, or keep it out of the install")
  endif()
endforeach()

run_step(${CMAKE_COMMAND} -S "${CONSUMER_SRC}" -B "${WORK_DIR}/build" -G "${CMAKE_GENERATOR}"
  "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix")
run_step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run_step("${WORK_DIR}/build/consumer")
run_step("${WORK_DIR}/build/consumer_experiments")
