# Locate the pinned llama.cpp tree: PYLLAMA_SO_UPSTREAM_DIR (CMake variable or environment) names a
# local tree, whose needed parts are copied into the build folder (the patches apply to the copy, never
# to the user's checkout); otherwise scripts/fetch-upstream fetches and verifies the pinned one into
# .upstream/.

file(READ "${PROJECT_SOURCE_DIR}/cmake/upstream-pin.json" _pin)
string(JSON PYLLAMA_SO_UPSTREAM_COMMIT  GET "${_pin}" commit)
string(JSON PYLLAMA_SO_UPSTREAM_VERSION GET "${_pin}" version)

if (NOT PYLLAMA_SO_UPSTREAM_DIR AND DEFINED ENV{PYLLAMA_SO_UPSTREAM_DIR})
    set(PYLLAMA_SO_UPSTREAM_DIR "$ENV{PYLLAMA_SO_UPSTREAM_DIR}")
endif()

if (PYLLAMA_SO_UPSTREAM_DIR)
    get_filename_component(_local "${PYLLAMA_SO_UPSTREAM_DIR}" ABSOLUTE)
    set(PYLLAMA_SO_UPSTREAM_DIR "${CMAKE_BINARY_DIR}/upstream-copy/llama.cpp")
    message(STATUS "pyllama_so: using a copy of the local llama.cpp tree ${_local} in ${PYLLAMA_SO_UPSTREAM_DIR}")
    execute_process(
        COMMAND "${Python_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/scripts/fetch-upstream" --from-tree "${_local}" --dest "${PYLLAMA_SO_UPSTREAM_DIR}"
        RESULT_VARIABLE _rc)
    if (NOT _rc EQUAL 0)
        message(FATAL_ERROR "pyllama_so: copying the local llama.cpp tree ${_local} failed (see above)")
    endif()
else()
    set(PYLLAMA_SO_UPSTREAM_DIR "${PROJECT_SOURCE_DIR}/.upstream/llama.cpp")
    execute_process(
        COMMAND "${Python_EXECUTABLE}" "${PROJECT_SOURCE_DIR}/scripts/fetch-upstream" --dest "${PYLLAMA_SO_UPSTREAM_DIR}"
        RESULT_VARIABLE _rc)
    if (NOT _rc EQUAL 0)
        message(FATAL_ERROR "pyllama_so: fetching llama.cpp ${PYLLAMA_SO_UPSTREAM_COMMIT} failed (see above)")
    endif()
endif()

if (NOT EXISTS "${PYLLAMA_SO_UPSTREAM_DIR}/include/llama.h")
    message(FATAL_ERROR "pyllama_so: ${PYLLAMA_SO_UPSTREAM_DIR} is not a llama.cpp tree (no include/llama.h)")
endif()
