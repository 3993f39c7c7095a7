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

# A missing one stops the build in one line naming Debian's package (pip
# install . on a machine without them says what to apt-get, not CMake's page).
macro(fullburn_require_package name debian_package)
  find_package(${name} ${ARGN} QUIET)
  if(NOT ${name}_FOUND)
    message(FATAL_ERROR "fullburn: ${name} not found: install ${debian_package} (Debian/Ubuntu: "
                        "apt-get install ${debian_package}; scripts/install-deps.sh installs them all)")
  endif()
endmacro()

# What the libraries need (the executables and tests find the rest).
macro(fullburn_find_library_deps)
  find_package(Threads REQUIRED)
  fullburn_require_package(SQLite3 libsqlite3-dev)
  fullburn_require_package(nlohmann_json nlohmann-json3-dev 3)
  fullburn_require_package(fmt libfmt-dev)
  fullburn_require_package(JPEG libjpeg62-turbo-dev)
  fullburn_require_package(PNG libpng-dev)
  fullburn_find_pkg(TOMLPP tomlplusplus toml++/toml.h libtomlplusplus-dev)
endmacro()
