# Checks of the source tree that run as ctests in `make test`.

find_package(Python3 REQUIRED COMPONENTS Interpreter)

# Every #include points down the layers of docs/ARCHITECTURE.md.
add_test(NAME check_layers
         COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/scripts/check_layers.py ${PROJECT_SOURCE_DIR})
set_tests_properties(check_layers PROPERTIES LABELS "unit;check" TIMEOUT 60)
