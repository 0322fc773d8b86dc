# ctest driver (cpu_layering): no file in a lower layer includes a higher one. Layers, lowest
# first: engine → kernels → nets, datasets → experiments → examples, bench. A file may include
# its own layer's headers and any lower layer's; nets and datasets are side by side and include
# neither each other. The umbrella headers stand just above what they include: <ditto/ditto.h>
# above nets and datasets, <ditto/experiments.h> above experiments.
#   cmake -DSRC=<source dir> -P tests/layering.cmake
set(rank_engine 0)
set(rank_kernels 2)
set(rank_nets 4)
set(rank_datasets 4)
set(rank_ditto/ditto.h 5)
set(rank_experiments 6)
set(rank_ditto/experiments.h 7)
set(rank_examples 8)
set(rank_bench 8)
set(bad "")
foreach(layer engine kernels nets datasets experiments examples bench)
  file(GLOB_RECURSE files RELATIVE "${SRC}" "${SRC}/${layer}/*.h" "${SRC}/${layer}/*.cpp" "${SRC}/${layer}/*.cu"
       "${SRC}/${layer}/*.cuh")
  foreach(f IN LISTS files)
    file(STRINGS "${SRC}/${f}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<](engine|kernels|nets|datasets|experiments|examples|bench|ditto)/")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*" "\\1" path "${line}")
      string(REGEX REPLACE "/.*" "" target "${path}")
      if(target STREQUAL "ditto")
        set(target "${path}")
      endif()
      if(NOT DEFINED rank_${target})
        continue()
      endif()
      if(target STREQUAL layer)
        continue()
      endif()
      if(NOT rank_${target} LESS rank_${layer})
        string(APPEND bad "  ${f} includes ${path}\n")
      endif()
    endforeach()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "a lower layer includes a higher one (engine → kernels → nets, datasets → experiments → "
                      "examples, bench):\n${bad}")
endif()
message("layering ok")
