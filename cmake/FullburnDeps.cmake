# The packages fullburn's libraries link, found the same way when fullburn is
# built (CMakeLists.txt) and when a program links an installed fullburn
# (fullburnConfig.cmake, beside which this file is installed).

# PkgConfig::<VAR> for a library Debian builds as a shared library with a
# pkg-config file (cpp-httplib, toml++); where there is none (the GPU machine,
# scripts/device-kit.sh), an imported target of its headers alone, found by
# find_path(<VAR>_INCLUDE_DIR <header>), with <VAR>_LIBRARY and
# <VAR>_DEFINITIONS when the headers were split from a built library.
# Imported either way, so an exported target names it, never a build's own.
function(fullburn_find_pkg var module header debian_package)
  if(TARGET PkgConfig::${var})
    return()
  endif()
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(${var} QUIET IMPORTED_TARGET ${module})
    if(TARGET PkgConfig::${var})
      return()
    endif()
  endif()
  find_path(${var}_INCLUDE_DIR ${header})
  if(NOT ${var}_INCLUDE_DIR)
    message(FATAL_ERROR "${header} not found: install ${debian_package} (scripts/install-deps.sh)")
  endif()
  add_library(PkgConfig::${var} INTERFACE IMPORTED)
  target_include_directories(PkgConfig::${var} SYSTEM INTERFACE ${${var}_INCLUDE_DIR})
  if(${var}_LIBRARY)
    target_link_libraries(PkgConfig::${var} INTERFACE ${${var}_LIBRARY})
    target_compile_definitions(PkgConfig::${var} INTERFACE ${${var}_DEFINITIONS})
  endif()
  message(STATUS "fullburn: ${header} header-only, from ${${var}_INCLUDE_DIR}")
endfunction()

# What the libraries need (the executables and tests find the rest).
macro(fullburn_find_library_deps)
  find_package(Threads REQUIRED)
  find_package(SQLite3 REQUIRED)
  find_package(nlohmann_json 3 REQUIRED)
  find_package(fmt REQUIRED)
  find_package(JPEG REQUIRED)
  find_package(PNG REQUIRED)
  fullburn_find_pkg(TOMLPP tomlplusplus toml++/toml.h libtomlplusplus-dev)
endmacro()
