# Writes the "Run it" output of one lesson: cmake -DEXE=... -DNAME=... -DARGS=a|b|c -DOUT=...
#   -DRECORDED=docs/results/stageNN_run.txt [-DPREFER_RECORDED=ON] -P run_lesson.cmake
#
# EXE empty means the stage is not built in this configuration (a GPU stage without a CUDA
# compiler). Precedence (see docs/CMakeLists.txt):
#   ran here (exit 0)                    -> this run's output, unless PREFER_RECORDED and RECORDED exists
#   skipped (exit 77) or not built here  -> RECORDED when it exists, else the skip line / a note
#   any other exit code                  -> the build fails: a lesson must not show a failing run
cmake_minimum_required(VERSION 3.25)

get_filename_component(out_name "${OUT}" NAME)
string(REPLACE "|" ";" args "${ARGS}")
list(JOIN args " " shown_args)
set(have_recorded OFF)
if(RECORDED AND EXISTS "${RECORDED}")
  set(have_recorded ON)
endif()

# A recording that does not start with its command line (`$ stageNN_name args`) gets the
# lesson's one: recordings are made with the stage's LESSON_ARGS.
function(use_recorded why)
  file(READ "${RECORDED}" recorded_text)
  if(NOT recorded_text MATCHES "^\\$ " AND NAME MATCHES "^stage")
    set(recorded_text "$ ${NAME} ${shown_args}\n${recorded_text}")
  endif()
  file(WRITE "${OUT}" "${recorded_text}")
  message(STATUS "docs: ${out_name} <- ${RECORDED} (recorded run; ${why})")
endfunction()

if(NOT EXE)
  if(have_recorded)
    use_recorded("this stage is not built here")
  else()
    file(WRITE "${OUT}" "$ ${NAME} ${shown_args}\n"
                        "(not run: this stage is not built in this configuration, and no recorded run is\n"
                        " committed in docs/results/ yet. Build with a CUDA compiler and run it to see\n"
                        " its output.)\n")
    message(STATUS "docs: ${out_name}: stage not built here and no recording committed")
  endif()
  return()
endif()

if(PREFER_RECORDED AND have_recorded)
  use_recorded("FA_DOCS_PREFER_RECORDED_RUNS is ON")
  return()
endif()

execute_process(COMMAND "${EXE}" ${args}
                OUTPUT_VARIABLE output ERROR_VARIABLE output
                RESULT_VARIABLE rc TIMEOUT 600)
set(transcript "$ ${NAME} ${shown_args}\n${output}")

if(rc EQUAL 77)
  if(have_recorded)
    use_recorded("${NAME} skipped on this machine")
  else()
    file(WRITE "${OUT}" "${transcript}")
    message(STATUS "docs: ${out_name}: ${NAME} skipped here and no recording is committed; the lesson shows the skip")
  endif()
elseif(rc EQUAL 0)
  file(WRITE "${OUT}" "${transcript}")
else()
  file(REMOVE "${OUT}")
  message(FATAL_ERROR "docs: `${NAME} ${shown_args}` (the run its lesson shows) exited with ${rc}:\n${transcript}")
endif()
