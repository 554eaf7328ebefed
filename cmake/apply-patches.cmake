# Apply patches/NNNN-*.patch to the upstream tree in order. A patch that is already applied (its
# reverse applies cleanly) is skipped, so configuring twice is harmless; a patch that applies neither
# way stops the configure with its name.

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
    foreach (_patch IN LISTS _patches)
        get_filename_component(_name "${_patch}" NAME)
        execute_process(COMMAND ${_git} apply --reverse --check "${_patch}"
                        WORKING_DIRECTORY "${tree}" RESULT_VARIABLE _applied OUTPUT_QUIET ERROR_QUIET)
        if (_applied EQUAL 0)
            message(STATUS "pyllama_so: patch ${_name}: already applied")
            continue()
        endif()
        execute_process(COMMAND ${_git} apply --whitespace=nowarn "${_patch}"
                        WORKING_DIRECTORY "${tree}" RESULT_VARIABLE _rc ERROR_VARIABLE _err)
        if (NOT _rc EQUAL 0)
            message(FATAL_ERROR "pyllama_so: patch ${_name} does not apply to ${tree}:\n${_err}\n"
                "Hint: the upstream tree is not the pinned one, or the patch needs a refresh. "
                "Re-extract the pinned tree with scripts/fetch-upstream --force.")
        endif()
        message(STATUS "pyllama_so: patch ${_name}: applied")
    endforeach()
endfunction()
