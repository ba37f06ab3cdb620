# cmake -DSOURCE=<repo> -DSCRC=<built scrc> -DCXX=<c++ compiler> -DWORK=<dir> -P expect_static_assert.cmake
# Generates tiny-llama for the spyre target, then hand-edits one planned tile (the first linear's
# row tile grows tenfold): compiling the edited source must fail on the plan's static_assert, while
# the unedited source compiles.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
execute_process(
  COMMAND ${SCRC} gen --arch-dir ${SOURCE}/models/arch --config ${SOURCE}/models/configs/llama/tiny-llama.json
          --quant ${SOURCE}/models/quant/f32.json --target spyre --out ${WORK}/model.cpp
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "scrc failed: ${out}${err}")
endif()
file(READ ${WORK}/model.cpp src)
string(FIND "${src}" ".tile_rows = 512, .tile_n = 1" at)
if(at EQUAL -1)
  message(FATAL_ERROR "no 512-row linear tile to edit in the generated source")
endif()
string(SUBSTRING "${src}" 0 ${at} head)
math(EXPR rest "${at} + 16")
string(SUBSTRING "${src}" ${rest} -1 tail)
file(WRITE ${WORK}/edited.cpp "${head}.tile_rows = 5120${tail}")
set(flags -std=c++20 -fsyntax-only -I${SOURCE})
execute_process(COMMAND ${CXX} ${flags} ${WORK}/model.cpp RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the generated source does not compile:\n${out}${err}")
endif()
execute_process(COMMAND ${CXX} ${flags} ${WORK}/edited.cpp RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "the hand-edited plan (a 5120-row tile) compiled; its static_assert must stop it")
endif()
foreach(want "static assertion failed" "must fit the scratchpad")
  string(FIND "${out}${err}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the compile error lacks \"${want}\":\n${out}${err}")
  endif()
endforeach()
message(STATUS "the edited plan fails to compile as expected")
