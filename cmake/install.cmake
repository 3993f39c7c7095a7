# `cmake --install BUILD [--prefix P]`: the commands in P/bin, the Python
# helpers `fullburn run` puts on a job's PYTHONPATH in P/share/fullburn/python
# (the installed fullburn finds them from its own path), and the libraries,
# headers and CMake package a program needs to train through the C++ API:
#   find_package(fullburn REQUIRED)
#   target_link_libraries(app PRIVATE fullburn::train)
# (examples/cpp_api). Libraries are static; what they link comes from the
# system, found again by fullburnConfig.cmake.
include(CMakePackageConfigHelpers)

set(FULLBURN_EXPORTED fullburn_common fullburn_telemetry fullburn_pipeline fullburn_store
    fullburn_dist_env fullburn_stacks fullburn_diagnose fullburn_recorder fullburn_config fullburn_report fullburn_tensorfile
    fullburn_run_traces)
if(TARGET fullburn_analyze)  # profiler traces; fullburn::train links it where it was built
  list(APPEND FULLBURN_EXPORTED fullburn_analyze)
  set(FULLBURN_WITH_ANALYZE ON)
else()
  set(FULLBURN_WITH_ANALYZE OFF)
endif()
set(FULLBURN_PROGRAMS fullburn fullburn-net)
if(FULLBURN_HAVE_TORCH)
  list(APPEND FULLBURN_EXPORTED fullburn_models fullburn_dist fullburn_train)
  if(TARGET fullburn_cuda_kernels)  # linked into fullburn::models where built
    list(APPEND FULLBURN_EXPORTED fullburn_cuda_kernels)
  endif()
  list(APPEND FULLBURN_PROGRAMS fullburn-train)
endif()
foreach(lib ${FULLBURN_EXPORTED})
  string(REPLACE "fullburn_" "" name ${lib})
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${name})  # fullburn::train
endforeach()

install(TARGETS ${FULLBURN_PROGRAMS} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ${FULLBURN_EXPORTED} EXPORT fullburnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/fullburn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY python/ DESTINATION ${CMAKE_INSTALL_DATADIR}/fullburn/python
        FILES_MATCHING PATTERN "*.py" PATTERN "package" EXCLUDE)  # the package: site-packages

set(FULLBURN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/fullburn)
install(EXPORT fullburnTargets NAMESPACE fullburn:: DESTINATION ${FULLBURN_CMAKE_DIR})
configure_package_config_file(cmake/fullburnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/fullburnConfig.cmake INSTALL_DESTINATION ${FULLBURN_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/fullburnConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/fullburnConfig.cmake
              ${PROJECT_BINARY_DIR}/fullburnConfigVersion.cmake cmake/FullburnDeps.cmake
        DESTINATION ${FULLBURN_CMAKE_DIR})

# pip's build (scikit-build-core, pyproject.toml installs only this component):
# one package in site-packages holding the command, its helpers and the module,
#   fullburn/_bin/fullburn     the command (venv/bin/fullburn, the entry point
#                              fullburn._cli:main, execs it)
#   fullburn/_bin/fullburn-net serve and fleet, which fullburn execs
#   fullburn/_python/          the helpers fullburn run puts on a job's PYTHONPATH
#   fullburn/*.py, _native.*   import fullburn
# so `pip uninstall fullburn` removes all of it.
if(SKBUILD)
  install(TARGETS fullburn fullburn-net RUNTIME DESTINATION fullburn/_bin COMPONENT wheel)
  install(DIRECTORY python/ DESTINATION fullburn/_python COMPONENT wheel
          FILES_MATCHING PATTERN "*.py" PATTERN "package" EXCLUDE PATTERN "__pycache__" EXCLUDE)
  if(FULLBURN_HAVE_PYTHON)
    install(DIRECTORY ${FULLBURN_PYTHON_DIR}/fullburn/ DESTINATION fullburn COMPONENT wheel
            USE_SOURCE_PERMISSIONS PATTERN "__pycache__" EXCLUDE)
  endif()
endif()
