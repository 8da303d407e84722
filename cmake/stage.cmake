# fa_add_stage(NN name SOURCES ... MAIN main.cpp [DEPENDS fa_stageMM ...] [LESSON_ARGS ...])
#
# Builds the library fa_stageNN from SOURCES (the stage's entry point) and the executable
# stageNN_<name> from MAIN. DEPENDS names the earlier stages it is checked against.
# LESSON_ARGS are the options of the run its lesson shows; the docs build runs the stage with
# them and includes the real output in the lesson page.
function(fa_add_stage number name)
  cmake_parse_arguments(ARG "" "MAIN" "SOURCES;DEPENDS;LESSON_ARGS" ${ARGN})
  add_library(fa_stage${number} ${ARG_SOURCES})
  target_include_directories(fa_stage${number} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(fa_stage${number} PUBLIC fa_common ${ARG_DEPENDS} PRIVATE fa_warnings)
  add_executable(stage${number}_${name} ${ARG_MAIN})
  target_link_libraries(stage${number}_${name} PRIVATE fa_stage${number} fa_warnings)
  set_property(GLOBAL APPEND PROPERTY FA_STAGE_EXECUTABLES stage${number}_${name})
  set_target_properties(stage${number}_${name} PROPERTIES FA_LESSON_ARGS "${ARG_LESSON_ARGS}" FA_STAGE_NUMBER "${number}")
endfunction()
