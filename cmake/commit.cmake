# Run at build time (cmake -P): the checkout's commit into OUT, a one-line C++ source that is
# rewritten only when the commit changes, so that an unchanged checkout rebuilds nothing.
# SRC: the source folder. The commit is "" when SRC is not the top of a git checkout (a source
# tarball, or a folder inside another project's repository), and ends in "-dirty" when tracked
# files differ from it.
set(commit "")
execute_process(COMMAND git -C "${SRC}" rev-parse --show-toplevel OUTPUT_VARIABLE top
                RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(rc EQUAL 0)
  file(REAL_PATH "${top}" top)
  file(REAL_PATH "${SRC}" src)
endif()
if(rc EQUAL 0 AND top STREQUAL src)
  execute_process(COMMAND git -C "${SRC}" rev-parse --short=12 HEAD OUTPUT_VARIABLE commit
                  RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  execute_process(COMMAND git -C "${SRC}" status --porcelain --untracked-files=no OUTPUT_VARIABLE changes
                  RESULT_VARIABLE rc2 ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(commit "")
  elseif(NOT rc2 EQUAL 0 OR NOT changes STREQUAL "")
    string(APPEND commit "-dirty")
  endif()
endif()
file(CONFIGURE OUTPUT "${OUT}" CONTENT
     "// Written at build time by cmake/commit.cmake.\nnamespace kvlab { extern const char* const kBuildCommit; const char* const kBuildCommit = \"${commit}\"; }\n")
