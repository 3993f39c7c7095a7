# `import fullburn`: the Python package (python/package/fullburn/*.py) and
# its native half (src/python/module.cpp, pybind11), assembled in
# ${PROJECT_BINARY_DIR}/python/fullburn, where the tests and a build-tree
# `fullburn run` use it; `cmake --install BUILD --component python` puts it in
# the site-packages of Debian's /usr/bin/python3 (or FULLBURN_PYTHON_INSTALL_DIR).
# Built when pybind11 and Python's headers are found (FULLBURN_WITH_PYTHON=AUTO),
# as the training half is when libtorch is; needs no torch to build.
set(FULLBURN_WITH_PYTHON "AUTO" CACHE STRING "Build the Python module (pybind11): AUTO, ON or OFF")
set_property(CACHE FULLBURN_WITH_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(FULLBURN_HAVE_PYTHON OFF)
set(FULLBURN_PYTHON_DIR ${PROJECT_BINARY_DIR}/python)

function(fullburn_python_module)
  if(FULLBURN_WITH_PYTHON STREQUAL "OFF")
    return()
  endif()
  # Debian's interpreter, which has python3-torch and python3-numpy, not
  # whichever python3 comes first on PATH.
  if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "The Python the module is built for")
  endif()
  # ON (pip's build) fails in one line naming the fix, not CMake's page.
  find_package(Python 3.8 COMPONENTS Interpreter Development.Module QUIET)
  if(NOT Python_FOUND)
    if(FULLBURN_WITH_PYTHON STREQUAL "ON")
      message(FATAL_ERROR "fullburn: Python.h not found for ${Python_EXECUTABLE}: install its headers "
                          "(Debian/Ubuntu: apt-get install python3-dev; pyenv and conda have them)")
    endif()
    message(STATUS "fullburn: Python module off (python3-dev not found)")
    return()
  endif()
  set(PYBIND11_FINDPYTHON ON)
  find_package(pybind11 CONFIG QUIET)
  if(NOT pybind11_FOUND)
    if(FULLBURN_WITH_PYTHON STREQUAL "ON")
      message(FATAL_ERROR "fullburn: pybind11 not found: pip install pybind11 (pip install . "
                          "brings it), or apt-get install pybind11-dev")
    endif()
    message(STATUS "fullburn: Python module off (pybind11-dev not found)")
    return()
  endif()
  pybind11_add_module(fullburn_python MODULE ${PROJECT_SOURCE_DIR}/src/python/module.cpp)
  target_link_libraries(fullburn_python PRIVATE fullburn_pipeline fullburn_tensorfile fullburn_common)
  set_target_properties(fullburn_python PROPERTIES OUTPUT_NAME _native
                        LIBRARY_OUTPUT_DIRECTORY ${FULLBURN_PYTHON_DIR}/fullburn)
  file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/package/fullburn/*.py)
  set(copied)
  foreach(src ${sources})
    get_filename_component(name ${src} NAME)
    add_custom_command(OUTPUT ${FULLBURN_PYTHON_DIR}/fullburn/${name}
      COMMAND ${CMAKE_COMMAND} -E copy_if_different ${src} ${FULLBURN_PYTHON_DIR}/fullburn/${name}
      DEPENDS ${src})
    list(APPEND copied ${FULLBURN_PYTHON_DIR}/fullburn/${name})
  endforeach()
  # The step markers, importable as fullburn.markers too (markers.py loads this copy
  # when python/fullburn_markers.py is not on the path).
  add_custom_command(OUTPUT ${FULLBURN_PYTHON_DIR}/fullburn/_markers_impl.py
    COMMAND ${CMAKE_COMMAND} -E copy_if_different ${PROJECT_SOURCE_DIR}/python/fullburn_markers.py
            ${FULLBURN_PYTHON_DIR}/fullburn/_markers_impl.py
    DEPENDS ${PROJECT_SOURCE_DIR}/python/fullburn_markers.py)
  list(APPEND copied ${FULLBURN_PYTHON_DIR}/fullburn/_markers_impl.py)
  # One source of truth for the version: the CMake project's.
  file(CONFIGURE OUTPUT ${FULLBURN_PYTHON_DIR}/fullburn/_version.py
       CONTENT "__version__ = \"${PROJECT_VERSION}\"\n")
  add_custom_target(fullburn_python_package ALL DEPENDS ${copied})
  add_dependencies(fullburn_python fullburn_python_package)

  set(site "site-packages")
  if(CMAKE_INSTALL_PREFIX STREQUAL "/usr/local")
    set(site "dist-packages")  # Debian's python3 reads /usr/local/lib/python3.X/dist-packages
  endif()
  set(FULLBURN_PYTHON_INSTALL_DIR
      "lib/python${Python_VERSION_MAJOR}.${Python_VERSION_MINOR}/${site}"
      CACHE STRING "Where cmake --install puts the fullburn package (relative: under the prefix)")
  install(DIRECTORY ${FULLBURN_PYTHON_DIR}/fullburn DESTINATION ${FULLBURN_PYTHON_INSTALL_DIR}
          COMPONENT python USE_SOURCE_PERMISSIONS PATTERN "__pycache__" EXCLUDE)
  set(FULLBURN_HAVE_PYTHON ON PARENT_SCOPE)
  set(Python_EXECUTABLE ${Python_EXECUTABLE} PARENT_SCOPE)
endfunction()
