# Standalone Asio for a metronome built with METRONOME_STANDALONE_ASIO: the imported
# target metronome::asio (Asio's headers, ASIO_STANDALONE, Threads). Included by
# metronome's CMakeLists.txt and by its installed package config, so a consumer finds
# the same Asio. Sets metronome_asio_FOUND, and metronome_asio_message when not found.
# A non-system Asio: set METRONOME_ASIO_INCLUDE_DIR (the folder holding asio.hpp). The
# installed package looks first where the library's own Asio was (metronome_asio_hint), and
# requires the version the library was built with (metronome_asio_required): headers of
# another Asio would not match the compiled library.
find_path(METRONOME_ASIO_INCLUDE_DIR asio/version.hpp HINTS ${metronome_asio_hint})
mark_as_advanced(METRONOME_ASIO_INCLUDE_DIR)
if(NOT METRONOME_ASIO_INCLUDE_DIR)
  set(metronome_asio_FOUND FALSE)
  set(metronome_asio_message "standalone Asio not found (asio/version.hpp; Debian: libasio-dev; or set METRONOME_ASIO_INCLUDE_DIR)")
  return()
endif()
file(STRINGS ${METRONOME_ASIO_INCLUDE_DIR}/asio/version.hpp _metronome_asio_version REGEX "#define ASIO_VERSION ")
string(REGEX MATCH "[0-9]+" _metronome_asio_version "${_metronome_asio_version}")
if(_metronome_asio_version LESS 102201)
  set(metronome_asio_FOUND FALSE)
  set(metronome_asio_message "standalone Asio ${_metronome_asio_version} in ${METRONOME_ASIO_INCLUDE_DIR} is older than 1.22.1 (102201)")
  return()
endif()
if(metronome_asio_required AND NOT _metronome_asio_version EQUAL metronome_asio_required)
  set(metronome_asio_FOUND FALSE)
  set(metronome_asio_message "standalone Asio ${_metronome_asio_version} in ${METRONOME_ASIO_INCLUDE_DIR}, but metronome was built with ${metronome_asio_required}: set METRONOME_ASIO_INCLUDE_DIR to that Asio")
  return()
endif()
set(metronome_asio_version ${_metronome_asio_version})
set(metronome_asio_FOUND TRUE)
if(NOT TARGET metronome::asio)
  find_package(Threads REQUIRED)
  add_library(metronome::asio INTERFACE IMPORTED GLOBAL)
  set_target_properties(metronome::asio PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${METRONOME_ASIO_INCLUDE_DIR}
    # Asio before 1.24 misses clang's C++20 coroutines (include/metronome/detail/asio.hpp).
    INTERFACE_COMPILE_DEFINITIONS "ASIO_STANDALONE;$<$<AND:$<CXX_COMPILER_ID:Clang>,$<VERSION_LESS:${_metronome_asio_version},102400>>:ASIO_HAS_CO_AWAIT=1>"
    INTERFACE_LINK_LIBRARIES Threads::Threads)
endif()
