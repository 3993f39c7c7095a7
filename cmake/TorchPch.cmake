# One precompiled <torch/torch.h> for the training half.
#
# Why: parsing libtorch's headers is most of a training file's compile time
# (amp.cpp: 31 s, 13 s with the PCH; trainer_setup.cpp: 37 s, 20 s), and
# there are ~35 such files. The PCH is built once, in fullburn_torch_pch,
# and reused by each target whose files all include libtorch.
#
# GCC uses a PCH only where the -fpic/-fpie settings match those it was built
# with, so executables that reuse it are compiled as position-independent
# code too (-fPIC; they still link as PIE). Where GCC refuses the PCH anyway
# (-Winvalid-pch says so), the file is compiled from the headers as before:
# slower, never wrong.
option(FULLBURN_TORCH_PCH "Precompile <torch/torch.h> once for the training half" ON)

function(fullburn_torch_pch_host)
  if(NOT FULLBURN_TORCH_PCH)
    return()
  endif()
  add_library(fullburn_torch_pch OBJECT "${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp")
  target_link_libraries(fullburn_torch_pch PRIVATE "${TORCH_LIBRARIES}")
  set_target_properties(fullburn_torch_pch PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_precompile_headers(fullburn_torch_pch PRIVATE <torch/torch.h>)
endfunction()

function(fullburn_use_torch_pch)
  if(NOT FULLBURN_TORCH_PCH)
    return()
  endif()
  foreach(target IN LISTS ARGN)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
      target_compile_options(${target} PRIVATE -fPIC)
    endif()
    target_precompile_headers(${target} REUSE_FROM fullburn_torch_pch)
  endforeach()
endfunction()
