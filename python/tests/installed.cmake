# ctest driver (cpu_python_installed): installs the python component (what a wheel holds) into SITE,
# checks that `import ditto` finds that copy, and runs the CPU tests against it.
#   cmake -DBUILD=<build dir> -DSITE=<scratch> -DPYTHON=<interpreter> -DTESTS=<python/tests> -P installed.cmake
file(REMOVE_RECURSE "${SITE}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD}" --component python --prefix "${SITE}"
  RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "installing the python component into ${SITE} failed (${rc})")
endif()
set(ENV{PYTHONPATH} "${SITE}")
# From SITE: the current folder comes first on Python's path, and the build tree's folder holds a
# package of the same name.
execute_process(COMMAND "${PYTHON}" -c "import ditto; print(ditto.__file__)" OUTPUT_VARIABLE where
  WORKING_DIRECTORY "${SITE}" RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(rc OR NOT where MATCHES "^${SITE}/")
  message(FATAL_ERROR "import ditto did not load the installed package from ${SITE} (got '${where}', ${rc})")
endif()
execute_process(COMMAND "${PYTHON}" -m pytest -q -p no:cacheprovider --ignore=${TESTS}/gpu ${TESTS}
  WORKING_DIRECTORY "${SITE}" RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the CPU tests failed against the installed package (${rc})")
endif()
