# Fashion-MNIST reader (ext_fashion_mnist.cpp) reads gzip'd IDX files through zlib.
find_package(ZLIB REQUIRED)
target_link_libraries(brigade_data PRIVATE ZLIB::ZLIB)
