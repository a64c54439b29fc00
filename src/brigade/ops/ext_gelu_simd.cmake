# The exact-GELU kernels (ext_encoder.cpp) use glibc's libmvec vector erff / expf when it is
# there (glibc >= 2.35, x86-64; Debian 12 has 2.36), else the scalar loop.
find_library(BRIGADE_LIBMVEC mvec)
if(BRIGADE_LIBMVEC)
  target_compile_definitions(brigade_ops PRIVATE BRIGADE_HAVE_LIBMVEC)
  target_link_libraries(brigade_ops PRIVATE ${BRIGADE_LIBMVEC})
endif()
