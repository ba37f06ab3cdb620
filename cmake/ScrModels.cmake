# Resolves SCR_MODELS x SCR_QUANT into specializations and runs scrc on each at build time.
#
# SCR_MODELS entries: a config stem (llama-3.2-1b), an architecture folder name (llama: all its
# configs), a glob over stems (tiny-*), `all`, or a path to any config.json.

function(scr_resolve_models out_configs)
  set(root ${PROJECT_SOURCE_DIR}/models/configs)
  set(found "")
  foreach(item IN LISTS SCR_MODELS)
    set(matches "")
    if(item STREQUAL "all")
      file(GLOB_RECURSE matches ${root}/*.json)
    elseif(EXISTS "${item}" AND NOT IS_DIRECTORY "${item}")
      get_filename_component(abs "${item}" ABSOLUTE)
      set(matches ${abs})
    elseif(IS_DIRECTORY ${root}/${item})
      file(GLOB matches ${root}/${item}/*.json)
    else()
      file(GLOB matches ${root}/*/${item}.json)
    endif()
    if(NOT matches)
      file(GLOB_RECURSE known RELATIVE ${root} ${root}/*.json)
      list(TRANSFORM known REPLACE "^.*/([^/]+)\\.json$" "\\1")
      list(JOIN known ", " known_text)
      message(FATAL_ERROR "SCR_MODELS: '${item}' names no config. Give a stem, an architecture folder of "
                          "models/configs, a glob, 'all', or a path to a config.json. Known stems: ${known_text}")
    endif()
    list(APPEND found ${matches})
  endforeach()
  list(REMOVE_DUPLICATES found)
  list(SORT found)
  set(${out_configs} ${found} PARENT_SCOPE)
endfunction()

function(scr_generate_models target_name)
  scr_resolve_models(configs)
  set(gen_dir ${PROJECT_BINARY_DIR}/gen)
  set(SCR_GEN_EXT cpp)
  if(SCR_TARGET STREQUAL "cuda")
    set(SCR_GEN_EXT cu)  # compiled by nvcc
  endif()
  file(GLOB arch_files ${PROJECT_SOURCE_DIR}/models/arch/*.scr)
  # SCR_HOST_SCRC: run an already built scrc instead of this tree's (a build test, a cross build).
  set(scrc_cmd scrc)
  if(SCR_HOST_SCRC)
    set(scrc_cmd ${SCR_HOST_SCRC})
  endif()
  set(sources "")
  set(symbols "")
  set(summary "")
  # `mlx` names every MLX affine int4 preset; an entry may also be a path to a preset JSON (tests).
  set(quants "")
  foreach(quant IN LISTS SCR_QUANT)
    if(quant STREQUAL "mlx")
      list(APPEND quants mlx-int4-g32 mlx-int4-g64 mlx-int4-g128)
    else()
      list(APPEND quants ${quant})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES quants)
  foreach(quant IN LISTS quants)
    set(preset ${PROJECT_SOURCE_DIR}/models/quant/${quant}.json)
    if(EXISTS "${quant}" AND NOT IS_DIRECTORY "${quant}")
      get_filename_component(preset "${quant}" ABSOLUTE)
      get_filename_component(quant "${quant}" NAME_WLE)
    endif()
    if(NOT EXISTS ${preset})
      file(GLOB presets RELATIVE ${PROJECT_SOURCE_DIR}/models/quant ${PROJECT_SOURCE_DIR}/models/quant/*.json)
      message(FATAL_ERROR "SCR_QUANT: no preset models/quant/${quant}.json (presets: ${presets})")
    endif()
    foreach(config IN LISTS configs)
      get_filename_component(stem ${config} NAME_WLE)
      set(sym "m_${stem}__${quant}__${SCR_TARGET}")
      string(REGEX REPLACE "[^A-Za-z0-9_]" "_" sym "${sym}")
      set(out ${gen_dir}/${sym}.${SCR_GEN_EXT})
      set(target_args "")
      if(SCR_TARGET STREQUAL "spyre")
        set(target_args --spyre-scratchpad-bytes ${SCR_SPYRE_SCRATCHPAD_BYTES})
      endif()
      add_custom_command(
        OUTPUT ${out}
        COMMAND ${scrc_cmd} gen --arch-dir ${PROJECT_SOURCE_DIR}/models/arch --config ${config} --quant ${preset}
                --target ${SCR_TARGET} --stem ${stem} --block-size ${SCR_BLOCK_SIZE}
                --max-batch-tokens ${SCR_MAX_BATCH_TOKENS} --max-logit-rows ${SCR_MAX_LOGIT_ROWS} ${target_args} --out ${out}
        DEPENDS ${scrc_cmd} ${config} ${preset} ${arch_files}
        COMMENT "scrc: ${stem} x ${quant} -> ${SCR_TARGET}"
        VERBATIM)
      list(APPEND sources ${out})
      list(APPEND symbols ${sym})
      list(APPEND summary "${stem}/${quant}")
    endforeach()
  endforeach()
  set(registry ${gen_dir}/registry.cpp)
  add_custom_command(
    OUTPUT ${registry}
    COMMAND ${scrc_cmd} registry --out ${registry} ${symbols}
    DEPENDS ${scrc_cmd}
    COMMENT "scrc: registry of ${CMAKE_CURRENT_LIST_LENGTH} specializations"
    VERBATIM)
  add_library(${target_name} STATIC ${sources} ${registry})
  # Only the generation step (scrc over every specialization), e.g. to check a plan without compiling it.
  add_custom_target(${target_name}_sources DEPENDS ${sources} ${registry})
  target_link_libraries(${target_name} PUBLIC scr_loader scr_core)
  if(SCR_TARGET STREQUAL "cuda")
    target_link_libraries(${target_name} PUBLIC scr_cuda)
  endif()
  target_include_directories(${target_name} PRIVATE ${PROJECT_SOURCE_DIR})
  list(JOIN summary ", " summary_text)
  message(STATUS "Scratchy: target ${SCR_TARGET}, specializations: ${summary_text}")
  set(SCR_SPECIALIZATIONS ${symbols} PARENT_SCOPE)
endfunction()
