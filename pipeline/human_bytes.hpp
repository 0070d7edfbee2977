// Byte counts for people: decimal units (1 KB = 1000 B, as disk rates are quoted), two decimals.
#pragma once
#include <string>

namespace k3::pipeline {

std::string human_bytes(double bytes);  // "0.00 B" .. "512.00 B", "1.23 KB", ... "4.34 GB", "1.56 TB"

}  // namespace k3::pipeline
