# find_package(attnreplay): what a kernel engineer's own project builds a plug-in kernel library
# against (docs/plugins.md). The library includes attnreplay's kernel interface and links nothing
# of attnreplay's: its symbols resolve against the attnreplay program that loads it.
#
#   find_package(attnreplay REQUIRED)
#   attnreplay_add_kernel_library(my_kernels my_kernel.cpp my_kernel.cu)
#   # then: attnreplay run CAPTURE --kernel-library $<TARGET_FILE:my_kernels> --kernels my-kernel
get_filename_component(_attnreplay_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

if(NOT TARGET attnreplay::plugin)
  add_library(attnreplay::plugin INTERFACE IMPORTED)
  set_target_properties(attnreplay::plugin PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${_attnreplay_prefix}/include/attnreplay"
    INTERFACE_COMPILE_FEATURES cxx_std_20)
endif()

set(attnreplay_EXECUTABLE "${_attnreplay_prefix}/bin/attnreplay")

# A loadable module of kernels: no undefined-symbol check at link time, since attnreplay itself
# supplies the registry and the call record when it loads the module.
function(attnreplay_add_kernel_library name)
  add_library(${name} MODULE ${ARGN})
  target_link_libraries(${name} PRIVATE attnreplay::plugin)
  set_target_properties(${name} PROPERTIES PREFIX "lib" CXX_VISIBILITY_PRESET hidden)
endfunction()
