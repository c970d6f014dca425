# `cmake --install build --prefix PREFIX` lays out a tree that works from anywhere:
#   bin/attnreplay, lib/libattncap.so and its torch part (LD_PRELOAD=PREFIX/lib/libattncap.so),
#   include/attnreplay/ and lib/cmake/attnreplay/ for plug-in kernel libraries (find_package),
#   share/attnreplay/python (attnreplay_plugin.py, attnreplay_h5.py), share/attnreplay/adapters,
#   share/doc/attnreplay.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS attnreplay RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The preload finds its torch part beside itself.
install(TARGETS attncap attncap_torch LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})

# The kernel interface a plug-in library compiles against, with the paths its includes name.
install(FILES kernels/kernel.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attnreplay/kernels)
install(FILES formats/attention_call.h formats/host_tensor.h formats/dtype.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attnreplay/formats)
install(FILES cmake/attnreplayConfig.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attnreplay)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/attnreplayConfigVersion.cmake
                                 COMPATIBILITY ExactVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/attnreplayConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attnreplay)

install(FILES kernels/python/attnreplay_plugin.py formats/python/attnreplay_h5.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/attnreplay/python)
install(DIRECTORY kernels/adapters/ DESTINATION ${CMAKE_INSTALL_DATADIR}/attnreplay/adapters
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING PATTERN "*.md")
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
