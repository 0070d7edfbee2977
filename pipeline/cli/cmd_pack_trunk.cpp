// `k3flow pack-trunk MODEL_DIR TRUNK_DIR [--codec none|exp4|exp3|huff] [--verify] [--force] [--progress |
// --no-progress]`: copy every layer's dense tensors into TRUNK_DIR/trunk.bin (+ trunk.json), one
// 4096-aligned run per layer, so streaming reads each layer with one O_DIRECT read
// (io/packed_trunk.hpp); with a codec each layer is stored losslessly compressed (docs/codec.md).
// TRUNK_DIR must not hold a trunk already unless --force. Ctrl-C / SIGTERM: the pack stops at the
// next chunk, removes its temporaries (and TRUNK_DIR when it created it), says so on one line and
// exits 130 / 143; a failed pack cleans up the same way (exit 1).
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "io/config.hpp"
#include "io/error.hpp"
#include "io/packed_trunk.hpp"
#include "io/safetensors.hpp"
#include "pipeline/cli/commands.hpp"
#include "pipeline/support/human_bytes.hpp"
#include "pipeline/support/interrupt.hpp"
#include "pipeline/support/output_file.hpp"
#include "pipeline/support/progress.hpp"

namespace k3::pipeline {

namespace {

namespace fs = std::filesystem;

struct PackArgs;
int pack_and_verify(const PackArgs& a, bool& packed);

struct PackArgs {
  std::string model_dir, trunk_dir, codec = "none";
  bool verify = false, force = false, progress = false, no_progress = false;
};

int run_pack(const PackArgs& a) {
  InterruptScope interrupts;
  bool packed = false;  // trunk.json and trunk.bin are in place (only --verify was still running)
  try {
    const fs::path out(a.trunk_dir);
    check_model_dir(a.model_dir);
    if (std::error_code ec; fs::exists(out, ec) && !fs::is_directory(out, ec))
      throw io::usage_error(fmt::format("TRUNK_DIR {}: is not a directory", out.string()));
    for (const char* name : {"trunk.json", "trunk.bin"})
      if (std::error_code ec; !a.force && fs::exists(out / name, ec))
        throw io::runtime_error(
            fmt::format("pack-trunk: {} already holds a packed trunk ({}); pass --force to replace it or "
                        "choose another directory",
                        out.string(), name));
    return pack_and_verify(a, packed);
  } catch (const io::Error&) {
    if (!InterruptScope::requested()) throw;
    std::error_code ec;
    const bool gone = !fs::exists(a.trunk_dir, ec);
    const bool complete = packed;
    std::fprintf(stderr, "k3flow: pack-trunk: interrupted by %s; %s\n",
                 InterruptScope::signal_number() == SIGTERM ? "SIGTERM" : "SIGINT",
                 complete ? "the packed trunk is complete, its verification was not"
                          : fmt::format("removed the partial trunk.bin / trunk.json{}",
                                        gone ? fmt::format(" and the directory {}", a.trunk_dir)
                                             : fmt::format(" in {}", a.trunk_dir))
                                .c_str());
    return interrupted_exit_code();
  }
}

int pack_and_verify(const PackArgs& a, bool& packed) {
  const fs::path dir(a.model_dir);
  const auto codec = io::codec::parse_codec(a.codec);
  if (!codec) throw io::usage_error(fmt::format("--codec {}: expected none, exp4, exp3 or huff", a.codec));
  io::ModelConfig config = io::load_config(dir / "config.json");
  io::ShardSet shards = io::ShardSet::open(dir);
  io::PackStats st;
  {
    Progress bar("pack-trunk", a.progress      ? Progress::Mode::always
                               : a.no_progress ? Progress::Mode::never
                                               : Progress::Mode::automatic);
    st = io::pack_trunk(
        shards, config.n_layers, a.trunk_dir, [&](uint64_t d, uint64_t t) { bar.update(d, t); },
        &InterruptScope::requested, *codec);
  }
  packed = true;
  fmt::print("pack-trunk: {} layers -> {} ({} B, {} of tensors) in {:.1f} s ({}); largest layer {} B ({})\n",
             config.n_layers, (fs::path(a.trunk_dir) / "trunk.bin").string(), st.bytes_written,
             human_bytes(double(st.payload_bytes)), st.seconds,
             human_rate(st.seconds > 0 ? double(st.bytes_written) / st.seconds : 0), st.largest_layer,
             human_bytes(double(st.largest_layer)));
  if (*codec != io::codec::Codec::none)
    fmt::print(
        "pack-trunk: codec {}: {} B decoded -> {} B stored (ratio {:.3f}, {:.1f}% saved); encode {:.1f} s "
        "({})\n",
        io::codec::codec_name(*codec), st.raw_bytes, st.bytes_written,
        double(st.bytes_written) / double(st.raw_bytes),
        100.0 * (1.0 - double(st.bytes_written) / double(st.raw_bytes)), st.encode_seconds,
        human_rate(st.encode_seconds > 0 ? double(st.raw_bytes) / st.encode_seconds : 0));
  if (a.verify) {
    io::PackedTrunk t = io::PackedTrunk::open(a.trunk_dir, config.n_layers);
    Progress bar("verify", a.progress      ? Progress::Mode::always
                           : a.no_progress ? Progress::Mode::never
                                           : Progress::Mode::automatic);
    uint64_t done = 0;
    for (const io::TrunkLayer& L : t.layers()) {
      if (InterruptScope::requested()) throw io::runtime_error("pack-trunk: interrupted");
      t.verify_layer(L.layer);
      bar.update(done += L.stored_bytes, t.file().size());
    }
    bar.finish();
    fmt::print("pack-trunk: verified {} layers (xxh64{})\n", t.layers().size(),
               t.codec() == io::codec::Codec::none ? "" : " of the decoded bytes");
  }
  return 0;
}

}  // namespace

Action add_pack_trunk(CLI::App& sub) {
  auto a = std::make_shared<PackArgs>();
  sub.add_option("MODEL_DIR", a->model_dir, "checkpoint directory (config.json + *.safetensors)")->required();
  sub.add_option("TRUNK_DIR", a->trunk_dir, "output directory for trunk.bin + trunk.json")->required();
  sub.add_option("--codec", a->codec, "store layers losslessly compressed: none (default), exp4, exp3, huff")
      ->check(CLI::IsMember({"none", "exp4", "exp3", "huff"}));
  sub.add_flag("--verify", a->verify, "re-read trunk.bin afterwards and check every layer's xxh64");
  sub.add_flag("--force", a->force, "replace the packed trunk already in TRUNK_DIR");
  auto* on =
      sub.add_flag("--progress", a->progress, "draw the progress bar even when stderr is not a terminal");
  sub.add_flag("--no-progress", a->no_progress, "never draw the progress bar")->excludes(on);
  return [a] { return run_pack(*a); };
}

}  // namespace k3::pipeline
