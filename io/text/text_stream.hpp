// Generated ids -> text to print, as they come: the tokenizer's streaming decoder (never half a
// UTF-8 sequence), end-of-turn ids that stop the generation, and stop strings. The printed text
// ends just before the first occurrence of any stop string; text that could still grow into one
// is held back until it cannot.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/text/tokenizer.hpp"

namespace k3::io::text {

// The ids that end a turn: K3 ends one with [EOS] (163585); the template closes messages with
// <|end_of_msg|> (163586); either ends it. Only those the tokenizer has (a byte vocabulary: none).
std::vector<int32_t> end_of_turn_ids(const Tokenizer&);

class TextStream {
 public:
  TextStream(const Tokenizer&, std::vector<int32_t> stop_ids, std::vector<std::string> stop_strings);

  struct Out {
    std::string text;   // print this now
    bool stop = false;  // a stop id or stop string was reached; nothing more will be printed
  };
  Out push(int32_t id);
  // After the last id (the cap was reached, or the run was interrupted): what was held back.
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  Out release();

  StreamDecoder dec_;
  std::vector<int32_t> stop_ids_;
  std::vector<std::string> stop_strings_;
  std::string held_;  // decoded text not yet printed
  bool stopped_ = false;
};

}  // namespace k3::io::text
