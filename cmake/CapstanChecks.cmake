# Checks of the source tree that run as ctests in `make test`.

find_package(Python3 REQUIRED COMPONENTS Interpreter)

# Every #include points down the layers of docs/ARCHITECTURE.md.
add_test(NAME check_layers
         COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check_layers.py ${PROJECT_SOURCE_DIR})
set_tests_properties(check_layers PROPERTIES LABELS "unit;check" TIMEOUT 60)

# Lock contracts: clang's thread-safety analysis (-Werror=thread-safety) over
# every .cc of the libraries, with this build's flags from
# compile_commands.json (docs/ARCHITECTURE.md "Threads and locks"). Needs
# clang++-14 (scripts/deps.sh) and the generated headers of a normal build.
# The script picks the libraries' sources among the static libraries named
# here (every one the build defines) by folder.
function(capstan_static_libraries dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  set(found)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "STATIC_LIBRARY")
      list(APPEND found ${t})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    capstan_static_libraries(${sub} sub_found)
    list(APPEND found ${sub_found})
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()
capstan_static_libraries(${PROJECT_SOURCE_DIR} _capstan_static_libraries)
list(JOIN _capstan_static_libraries "," _capstan_static_libraries)
add_test(NAME check_thread_safety
         COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check_thread_safety.py
                 ${CMAKE_BINARY_DIR} -j 2 --libraries ${_capstan_static_libraries})
set_tests_properties(check_thread_safety PROPERTIES LABELS "unit;check" TIMEOUT 1800 PROCESSORS 2)
