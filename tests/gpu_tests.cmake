# The GPU backend's tests (included from tests/CMakeLists.txt).
#   test_gpu_host      gpu-host decoders equal the CPU's, every layout and batched; a planted bug
# (Each GPU kernel against the CPU's, kernel by kernel: the backend table, test_backend_ops.)
# With CUDA in the build:
#   test_gpu_device    the CUDA backend against the CPU on a real device (exit 77, skipped, without one)
#   ptx_audit          the CUDA backend's PTX keeps the numeric contract
#   ptx_audit_counter_*  the audit rejects a fixture compiled with nvcc's defaults / --use_fast_math
kvlab_test(test_gpu_host test_gpu_host.cpp)
target_link_libraries(test_gpu_host PRIVATE kvlab_gpu)

if(TARGET kvlab_cuda)
  kvlab_test(test_gpu_device test_gpu_device.cpp)
  target_link_libraries(test_gpu_device PRIVATE kvlab_gpu)

  set(audit ${CMAKE_CURRENT_SOURCE_DIR}/ptx_audit.sh)
  add_test(NAME ptx_audit COMMAND bash ${audit} $<TARGET_OBJECTS:kvlab_cuda_ptx>)

  # The fixture's PTX as nvcc makes it when left to its defaults, and with --use_fast_math.
  set(fixture ${CMAKE_CURRENT_SOURCE_DIR}/ptx_audit_fixture.cu)
  foreach(variant default fast_math)
    set(flags "")
    if(variant STREQUAL "fast_math")
      set(flags --use_fast_math)
    endif()
    set(out ${CMAKE_CURRENT_BINARY_DIR}/ptx_audit_fixture_${variant}.ptx)
    add_custom_command(OUTPUT ${out}
      COMMAND ${CMAKE_CUDA_COMPILER} -ptx -arch=compute_90 ${flags} ${fixture} -o ${out}
      DEPENDS ${fixture} COMMENT "PTX of the audit's counter-test fixture (${variant})" VERBATIM)
    list(APPEND fixture_ptx ${out})
  endforeach()
  add_custom_target(ptx_audit_fixtures ALL DEPENDS ${fixture_ptx})
  set(expect_fail ${CMAKE_CURRENT_SOURCE_DIR}/ptx_audit_expect_fail.sh)
  add_test(NAME ptx_audit_counter_default
    COMMAND bash ${expect_fail} ${CMAKE_CURRENT_BINARY_DIR}/ptx_audit_fixture_default.ptx
            "fused multiply-add" "hardware function" "f32 without .rn")
  add_test(NAME ptx_audit_counter_fast_math
    COMMAND bash ${expect_fail} ${CMAKE_CURRENT_BINARY_DIR}/ptx_audit_fixture_fast_math.ptx
            "approximation" "denormals flushed" "f32 without .rn")
endif()
