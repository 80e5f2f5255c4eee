// server/content_encoding.h: request bodies sent with Content-Encoding gzip, x-gzip or deflate, inflated
// under a cap on the output (inflation stops as soon as the output would pass it, so a small compressed
// body cannot expand into memory). Must not: know about sockets or routes.
#pragma once

#include <optional>
#include <string>

#include "server/http_transport.h"

namespace polylora::server {

// Why a body cannot be used: 400 (corrupt, truncated, trailing bytes), 413 (over the cap) or 415 (an
// encoding other than gzip, x-gzip, deflate, identity).
struct DecodeError {
  int status;
  std::string message;
};

// Replaces req.body by its decoded bytes (no Content-Encoding or identity: unchanged); nullopt when ready.
std::optional<DecodeError> decode_body(HttpRequest& req, const HttpLimits& limits);

}  // namespace polylora::server
