# `cmake --install build --prefix PREFIX` lays out a tree that works from anywhere:
#   bin/attnreplay, lib/libattncap.so and its torch part (LD_PRELOAD=PREFIX/lib/libattncap.so),
#   bin/attnreplay-capture-build and share/attnreplay/capture-source (parts for other torches),
#   include/attnreplay/ and lib/cmake/attnreplay/ for plug-in kernel libraries (find_package),
#   share/attnreplay/python (attnreplay_plugin.py, attnreplay_adapters.py, attnreplay_h5.py), share/attnreplay/adapters,
#   share/doc/attnreplay.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS attnreplay RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# The preload finds the torch part built for the job's torch beside itself, in a folder that names
# that torch (capture/CMakeLists.txt); attnreplay-capture-build builds parts for other torches from
# the capture sources installed with it.
install(TARGETS attncap LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS attncap_torch LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/attncap-parts/${ATTNCAP_TORCH_KEY})
install(PROGRAMS ${CMAKE_BINARY_DIR}/bin/attnreplay-capture-build DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY capture/ DESTINATION ${CMAKE_INSTALL_DATADIR}/attnreplay/capture-source/capture
        FILES_MATCHING PATTERN "*.cpp" PATTERN "*.h" PATTERN "*.h.in" PATTERN "*.py" PATTERN "CMakeLists.txt")
install(DIRECTORY formats/ DESTINATION ${CMAKE_INSTALL_DATADIR}/attnreplay/capture-source/formats
        FILES_MATCHING PATTERN "*.cpp" PATTERN "*.h" PATTERN "CMakeLists.txt" PATTERN "python" EXCLUDE)
install(FILES scripts/attnreplay-capture-build.in DESTINATION ${CMAKE_INSTALL_DATADIR}/attnreplay/capture-source/scripts)

# The kernel interface a plug-in library compiles against, with the paths its includes name.
install(FILES kernels/kernel.h kernels/quant_options.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attnreplay/kernels)
install(FILES formats/attention_call.h formats/attention_shape.h formats/host_tensor.h formats/dtype.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attnreplay/formats)
install(FILES cmake/attnreplayConfig.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attnreplay)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/attnreplayConfigVersion.cmake
                                 COMPATIBILITY ExactVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/attnreplayConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/attnreplay)

install(FILES kernels/python/attnreplay_plugin.py kernels/python/attnreplay_adapters.py formats/python/attnreplay_h5.py scripts/plot_audit.py
        DESTINATION ${CMAKE_INSTALL_DATADIR}/attnreplay/python)
install(DIRECTORY kernels/adapters/ DESTINATION ${CMAKE_INSTALL_DATADIR}/attnreplay/adapters
        FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING PATTERN "*.md")
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
