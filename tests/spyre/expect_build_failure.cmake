# cmake -DSOURCE=<repo> -DSCRC=<built scrc> -DWORK=<dir> -DBYTES=<scratchpad> -DEXPECT="a;b;..." -P expect_build_failure.cmake
# Configures a spyre build of tiny-llama with SCR_SPYRE_SCRATCHPAD_BYTES=BYTES (using the already
# built scrc, so no compiler is rebuilt), builds its generation step, and succeeds only if the
# configure or the build FAILS and its output contains every EXPECT string.
file(REMOVE_RECURSE ${WORK})
if(NOT GENERATOR)
  set(GENERATOR Ninja)
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${WORK} -G ${GENERATOR} -DSCR_TARGET=spyre -DSCR_MODELS=tiny-llama -DSCR_QUANT=f32
          -DSCR_TESTS=OFF -DSCR_SPYRE_SCRATCHPAD_BYTES=${BYTES} -DSCR_HOST_SCRC=${SCRC}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(log "${out}${err}")
if(rc EQUAL 0)
  execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK} --target scr_models_sources
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(log "${log}${out}${err}")
  if(rc EQUAL 0)
    message(FATAL_ERROR "the spyre build with a ${BYTES}-byte scratchpad succeeded; it must fail:\n${log}")
  endif()
endif()
foreach(want IN LISTS EXPECT)
  string(FIND "${log}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the failing build's output lacks \"${want}\":\n${log}")
  endif()
endforeach()
message(STATUS "failed as expected:\n${log}")
