# Embeds the kernel runtime and the generated steps' driver into tally (codegen/RuntimeFiles.cpp
# includes the result), so `tally build` writes a folder that builds on its own; and, the same
# way, the templates of the generated CMakeLists.txt (-DROOT=<repo>/codegen/templates).
# -DROOT=<repo>/codegen -DOUT=<file.inc> -DFILES=<list of absolute paths under ROOT>
# Each file is named by its path under ROOT as the step's runtime/ folder has it: runtime/cpu/x.h
# is cpu/x.h, and the driver's sources, codegen/program/, are driver/ (runtime/driver/ in the
# step's folder, whose layout does not change with the source tree's).
set(TEXT "")
foreach(F ${FILES})
  file(RELATIVE_PATH REL ${ROOT} ${F})
  string(REGEX REPLACE "^runtime/" "" REL ${REL})
  string(REGEX REPLACE "^program/" "driver/" REL ${REL})
  file(READ ${F} CONTENT)
  string(FIND "${CONTENT}" ")tally_rt\"" BAD)
  if(NOT BAD EQUAL -1)
    message(FATAL_ERROR "${F} contains the raw-string delimiter )tally_rt\"")
  endif()
  string(APPEND TEXT "{\"${REL}\", R\"tally_rt(${CONTENT})tally_rt\"},\n")
endforeach()
file(WRITE ${OUT}.tmp "${TEXT}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUT}.tmp ${OUT})
