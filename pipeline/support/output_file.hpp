// Path arguments. Output files are never left half-written: bytes go to a temporary name in the
// same directory, which is renamed over the destination only once everything is on disk. Input
// paths are checked before any work: one that does not exist or is the wrong kind is a usage error
// (exit 2) naming the argument; a file that exists but whose content is wrong is found later (exit 1).
#pragma once
#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

namespace k3::pipeline {

// Throws k3::io::Error (runtime) naming `path` on failure; the temporary file is removed.
void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> bytes);
void write_file_atomic(const std::filesystem::path& path, std::string_view text);

// Before a long run: can `path` be written when the run ends? Creates and removes the temporary
// the write would use. A usage error (exit 2) naming `flag` and the path when it is a directory,
// its directory is missing, or the file cannot be created there.
void check_writable(const std::filesystem::path& path, std::string_view flag);

// MODEL_DIR must be an existing directory holding config.json (unless a --config was given, which
// replaces it). A usage error naming MODEL_DIR and the path otherwise.
void check_model_dir(const std::filesystem::path& dir, bool config_given = false);
// --trunk DIR must be an existing directory holding trunk.json (what pack-trunk writes).
void check_trunk_dir(const std::filesystem::path& dir);
// An input directory / regular file given by `what` (a flag or argument name) must exist as one.
void check_input_dir(const std::filesystem::path& dir, std::string_view what);
void check_input_file(const std::filesystem::path& file, std::string_view what);

}  // namespace k3::pipeline
