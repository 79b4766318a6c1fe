# lcmac's C API as a CMake package:
#
#   find_package(lcmac CONFIG REQUIRED PATHS "<output of `lcmac capi --cmake-dir`>")
#   add_executable(app app.cpp)
#   target_link_libraries(app PRIVATE lcmac::runtime)
#
# lcmac::runtime is the harness (lcmac_c.c, which includes the rest of its directory) built
# into the project as a static library, with lcmac.h on its include path.  Linking it exports
# the program's symbols (-rdynamic): a CPU artifact resolves one function of the harness,
# TVMFFIErrorSetRaisedFromCStrParts, against the program when it is loaded.  CUDA artifacts
# need nothing more: the harness loads the driver (libcuda.so.1) itself.
# Sets LCMAC_INCLUDE_DIR, LCMAC_SOURCE and LCMAC_API_VERSION (from lcmac.h).
get_filename_component(_lcmac_runtime "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(LCMAC_INCLUDE_DIR "${_lcmac_runtime}/include")
set(LCMAC_SOURCE "${_lcmac_runtime}/harness/lcmac_c.c")
file(STRINGS "${LCMAC_INCLUDE_DIR}/lcmac.h" _lcmac_api REGEX "^#define LCMAC_API_VERSION [0-9]+")
string(REGEX MATCH "[0-9]+" LCMAC_API_VERSION "${_lcmac_api}")

if(NOT TARGET lcmac::runtime)
  get_property(_lcmac_languages GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(NOT "C" IN_LIST _lcmac_languages)
    enable_language(C)   # the harness is C99; a C++-only project gets C for it
  endif()
  find_package(Threads REQUIRED)
  add_library(lcmac_runtime STATIC "${LCMAC_SOURCE}")
  set_target_properties(lcmac_runtime PROPERTIES C_STANDARD 99 C_EXTENSIONS ON
                        POSITION_INDEPENDENT_CODE ON)
  target_include_directories(lcmac_runtime PUBLIC "${LCMAC_INCLUDE_DIR}")
  target_link_libraries(lcmac_runtime PUBLIC Threads::Threads ${CMAKE_DL_LIBS})
  target_link_options(lcmac_runtime INTERFACE "-rdynamic")
  add_library(lcmac::runtime ALIAS lcmac_runtime)
endif()
set(lcmac_FOUND TRUE)
