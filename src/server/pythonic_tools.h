// server/pythonic_tools.h: the tool calls of vLLM's pythonic tool parsers (--tool-call-parser pythonic,
// llama4_pythonic: Llama 3.2 / Llama 4 and other models that write `[get_weather(city="Paris", days=3),
// other()]`): a Python list of calls with keyword arguments whose values are literals (strings, numbers,
// True / False / None and vLLM's true / false / null, lists, dicts with literal keys), turned into JSON
// arguments as Python's json.dumps(..., ensure_ascii=False) writes them (`{"city": "Paris", "days": 3}`).
// Anything else (positional arguments, names or expressions as values, tuples, bytes, a name that does not
// start with a letter, text after the list) is not a tool call: the output stays content, as in vLLM.
// Must not: know about requests or build response JSON.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/output_parser.h"

namespace polylora::server {

struct PythonicParse {
  bool ok = false;  // final: the whole text is one list of calls (then `calls` is all of them)
  // The calls whose name is known (the "(" after it seen), in order. Arguments: the JSON object so far,
  // growing by whole keyword arguments (`{"a": 1, "b": 2` ... then the closing "}"), so that what was
  // streamed is always a prefix of the final text.
  std::vector<ParsedToolCall> calls;
};

// `s` starts with "[". `final`: the output has ended (a text that ends inside the list is then not a call
// list).
PythonicParse parse_pythonic_calls(std::string_view s, bool final);

}  // namespace polylora::server
