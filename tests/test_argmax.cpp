#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "kernels/argmax.hpp"

using k3::kernels::argmax;

TEST_CASE("argmax returns the first index of the maximum") {
  CHECK(argmax(std::vector<float>{1.0f, 3.0f, 2.0f, 3.0f}) == 1);
  CHECK(argmax(std::vector<float>{-5.0f}) == 0);
  CHECK(argmax(std::vector<float>{-1.0f, -1.0f}) == 0);
  CHECK(argmax(std::vector<float>{NAN, 2.0f, 7.0f, NAN}) == 2);
  CHECK(argmax(std::vector<float>{-INFINITY, -INFINITY, -3.0f}) == 2);
}
