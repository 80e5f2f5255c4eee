// api/request.cc: names of enum values as the OpenAI/vLLM API spells them.
#include "api/request.h"

namespace polylora {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "?";
}

}  // namespace polylora
