# PyTorch's wheels export libstdc++ functions of their own from libtorch.so
# (std::filesystem's among them). A program whose link line names libtorch
# before libstdc++ takes those, unversioned, and on a lent GPU machine
# (PyTorch 2.11+cu130, 2026-11-25) std::filesystem::remove_all jumped to
# address 0 that way. Naming the shared libstdc++ ahead of every input binds
# each std:: call of our programs to it (GLIBCXX_* versions). There,
# libtorch.so had answered every std:: reference before the compiler's own
# -lstdc++ at the end of the line, and libstdc++ was not even among the
# program's libraries.
function(fullburn_stdcxx_first)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR NOT CMAKE_SYSTEM_NAME STREQUAL "Linux")
    return()
  endif()
  if(FULLBURN_SANITIZE)
    return()  # the sanitizer's runtime must come first
  endif()
  set(found "")
  foreach(name libstdc++.so libstdc++.so.6)
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=${name}
                    OUTPUT_VARIABLE path OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(IS_ABSOLUTE "${path}" AND EXISTS "${path}")
      set(found "${path}")
      break()
    endif()
  endforeach()
  if(NOT found)
    find_library(FULLBURN_LIBSTDCXX NAMES libstdc++.so.6)
    set(found "${FULLBURN_LIBSTDCXX}")
  endif()
  if(found)
    message(STATUS "fullburn: programs bind std:: to ${found}, ahead of libtorch")
    add_link_options("SHELL:-Wl,--no-as-needed ${found} -Wl,--as-needed")
  else()
    message(STATUS "fullburn: no shared libstdc++ found; std:: calls may bind to libtorch's copies")
  endif()
endfunction()
