# Upstream's llama-server from the pinned tree, next to our library (-DPYLLAMA_SO_UPSTREAM_SERVER=ON): the
# anchor that our server is measured against (scripts/server-load). It links the same libllama and libggml
# as our package, and the mtmd library of the same tree. No web UI (neither built with npm nor downloaded:
# llama-server then serves its API only) and no HTTPS (LLAMA_OPENSSL=OFF): nothing is fetched at build time.

function(pyllama_so_add_upstream_server)
    foreach (_dir tools/mtmd tools/ui tools/server)
        if (NOT EXISTS "${PYLLAMA_SO_UPSTREAM_DIR}/${_dir}/CMakeLists.txt")
            message(FATAL_ERROR "pyllama_so: PYLLAMA_SO_UPSTREAM_SERVER=ON but ${PYLLAMA_SO_UPSTREAM_DIR} has no ${_dir}")
        endif()
    endforeach()
    # These folders are normally added from upstream's top level: they take its root for PROJECT_SOURCE_DIR
    # (include paths, scripts/ui-assets.cmake) and its version variables. Set in this function's scope only.
    set(PROJECT_SOURCE_DIR "${PYLLAMA_SO_UPSTREAM_DIR}")
    foreach (_var LLAMA_VERSION_BASE LLAMA_VERSION_MAJOR LLAMA_BUILD_NUMBER)
        get_directory_property(_value DIRECTORY "${PYLLAMA_SO_UPSTREAM_DIR}" DEFINITION ${_var})
        set(${_var} "${_value}")
    endforeach()
    add_subdirectory("${PYLLAMA_SO_UPSTREAM_DIR}/tools/mtmd"   upstream-tools/mtmd)
    add_subdirectory("${PYLLAMA_SO_UPSTREAM_DIR}/tools/ui"     upstream-tools/ui)
    add_subdirectory("${PYLLAMA_SO_UPSTREAM_DIR}/tools/server" upstream-tools/server)
endfunction()
