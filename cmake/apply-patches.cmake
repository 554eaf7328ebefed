# Apply patches/NNNN-*.patch to the upstream tree in order, and record each one applied (its name and
# sha256) in the tree's .pyllama-so-patches. Configuring again skips what the record lists, so it is
# harmless even where a later patch changed an earlier one's context; a tree patched with another
# version of a patch stops the configure with its name. A tree without the record (patched before the
# record existed) falls back to a reverse check per patch.

function(_pyllama_so_patch_failed name tree detail)
    message(FATAL_ERROR "pyllama_so: patch ${name} does not apply to ${tree}:\n${detail}\n"
        "Hint: the upstream tree is not the pinned one, or the patch needs a refresh. "
        "Re-extract the pinned tree with scripts/fetch-upstream --force.")
endfunction()

function(pyllama_so_apply_patches tree patch_dir)
    find_package(Git QUIET)
    if (NOT GIT_FOUND)
        message(FATAL_ERROR "pyllama_so: git is needed to apply ${patch_dir}/*.patch")
    endif()
    file(GLOB _patches "${patch_dir}/[0-9][0-9][0-9][0-9]-*.patch")
    list(SORT _patches)
    # The tree may sit inside another git repository (ours): stop git from finding it, so that
    # paths are taken relative to the tree.
    get_filename_component(_parent "${tree}" DIRECTORY)
    set(_git "${CMAKE_COMMAND}" -E env "GIT_CEILING_DIRECTORIES=${_parent}" "${GIT_EXECUTABLE}")
    set(_record "${tree}/.pyllama-so-patches")
    set(_done)
    set(_have_record OFF)
    if (EXISTS "${_record}")
        file(STRINGS "${_record}" _done)
        set(_have_record ON)
    endif()
    set(_i 0)
    list(LENGTH _done _n_done)
    foreach (_patch IN LISTS _patches)
        get_filename_component(_name "${_patch}" NAME)
        file(SHA256 "${_patch}" _sha)
        set(_entry "${_name} ${_sha}")
        if (_i LESS _n_done)
            list(GET _done ${_i} _recorded)
            if (NOT _recorded STREQUAL _entry)
                _pyllama_so_patch_failed("${_name}" "${tree}"
                    "the tree holds another series (its record ${_record} lists \"${_recorded}\" here)")
            endif()
            message(STATUS "pyllama_so: patch ${_name}: already applied")
        else()
            set(_applied 1)
            if (NOT _have_record)  # a tree patched before the record existed: ask git instead
                execute_process(COMMAND ${_git} apply --reverse --check "${_patch}"
                                WORKING_DIRECTORY "${tree}" RESULT_VARIABLE _applied OUTPUT_QUIET ERROR_QUIET)
            endif()
            if (_applied EQUAL 0)
                message(STATUS "pyllama_so: patch ${_name}: already applied")
            else()
                execute_process(COMMAND ${_git} apply --whitespace=nowarn "${_patch}"
                                WORKING_DIRECTORY "${tree}" RESULT_VARIABLE _rc ERROR_VARIABLE _err)
                if (NOT _rc EQUAL 0)
                    _pyllama_so_patch_failed("${_name}" "${tree}" "${_err}")
                endif()
                message(STATUS "pyllama_so: patch ${_name}: applied")
            endif()
            file(APPEND "${_record}" "${_entry}\n")
        endif()
        math(EXPR _i "${_i} + 1")
    endforeach()
    if (_i LESS _n_done)
        list(GET _done ${_i} _recorded)
        _pyllama_so_patch_failed("(none)" "${tree}"
            "the tree holds a patch the series no longer has (its record ${_record} lists \"${_recorded}\")")
    endif()
endfunction()
