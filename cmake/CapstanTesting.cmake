# capstan_test(NAME SOURCES... LIBS libs... [LABELS labels...])
# Builds a GoogleTest binary and registers each of its tests with CTest.
include(GoogleTest)
function(capstan_test name)
  if(NOT CAPSTAN_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gmock GTest::gtest_main)
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST PROPERTIES LABELS "${T_LABELS}"
                       TIMEOUT 300)
endfunction()

# capstan_benchmark(NAME SOURCES... LIBS libs...)
function(capstan_benchmark name)
  if(NOT CAPSTAN_BUILD_BENCHMARKS)
    return()
  endif()
  cmake_parse_arguments(B "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${B_SOURCES})
  target_link_libraries(${name} PRIVATE ${B_LIBS} benchmark::benchmark benchmark::benchmark_main)
endfunction()

# capstan_test_against_etcd34(NAME [FILTER expr]): runs the cases of test
# binary NAME (those matching the gtest filter, default all) a second time
# with Debian 12's etcd 3.4 in place of the reference etcd 3.5, as the tests
# named "<case>.etcd34": the tests about data directories written by etcd,
# whose format 3.4 and 3.5 users both bring.
function(capstan_test_against_etcd34 name)
  if(NOT TARGET ${name})
    return()
  endif()
  cmake_parse_arguments(T "" "FILTER" "" ${ARGN})
  if(NOT T_FILTER)
    set(T_FILTER "*")
  endif()
  # Debian 12's etcd 3.4, or CAPSTAN_ETCD34_BINARY at configure time (the
  # same variable tests/process_fixture.h reads at run time).
  set(etcd34 "/usr/bin/etcd")
  if(DEFINED ENV{CAPSTAN_ETCD34_BINARY})
    set(etcd34 "$ENV{CAPSTAN_ETCD34_BINARY}")
  endif()
  get_filename_component(etcd34_dir "${etcd34}" DIRECTORY)
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST TEST_FILTER "${T_FILTER}"
                       TEST_SUFFIX ".etcd34"
                       PROPERTIES LABELS "integration" TIMEOUT 300
                       ENVIRONMENT "CAPSTAN_ETCD_BINARY=${etcd34};CAPSTAN_ETCDCTL_BINARY=${etcd34_dir}/etcdctl")
endfunction()
