// server/content_encoding.cc: gzip / deflate request bodies under an output cap (see the header).
#include "server/content_encoding.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>

#include "common/utf8.h"

namespace polylora::server {

std::optional<DecodeError> decode_body(HttpRequest& req, const HttpLimits& limits) {
  const std::string* enc = req.header("content-encoding");
  if (!enc) return std::nullopt;
  std::string e;
  for (char c : *enc)
    if (c != ' ' && c != '\t') e += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (e.empty() || e == "identity") return std::nullopt;
  if (e != "gzip" && e != "x-gzip" && e != "deflate")
    return DecodeError{415, "unsupported Content-Encoding '" + sanitize_utf8(*enc) +
                                "' (gzip, deflate and identity are accepted, one at a time)"};
  // Inflates the whole body. gzip bodies may hold several members one after another (RFC 1952 2.2); they
  // are inflated in turn, and any byte after the last member that is not one makes the body invalid (no
  // silently ignored trailing data). The limit applies to the total output.
  constexpr int kOverLimit = Z_BUF_ERROR + 1000;
  auto inflate_with = [&](int window_bits, bool members, std::string& out) -> int {
    z_stream zs{};
    if (inflateInit2(&zs, window_bits) != Z_OK) return Z_MEM_ERROR;
    auto* in = reinterpret_cast<Bytef*>(req.body.data());
    size_t in_left = req.body.size();
    out.clear();
    char buf[1 << 16];
    int rc = Z_OK;
    for (;;) {
      if (zs.avail_in == 0 && in_left > 0) {  // avail_in is 32-bit: feed large bodies in pieces
        zs.next_in = in;
        zs.avail_in = static_cast<uInt>(std::min<size_t>(in_left, 1u << 30));
        in += zs.avail_in;
        in_left -= zs.avail_in;
      }
      zs.next_out = reinterpret_cast<Bytef*>(buf);
      zs.avail_out = sizeof(buf);
      rc = inflate(&zs, Z_NO_FLUSH);
      size_t produced = sizeof(buf) - zs.avail_out;
      if (out.size() + produced > limits.max_decompressed_body_bytes) {
        rc = kOverLimit;
        break;
      }
      out.append(buf, produced);
      if (rc == Z_STREAM_END) {
        if (zs.avail_in == 0 && in_left == 0) break;  // the whole body was used
        if (!members || inflateReset(&zs) != Z_OK) {
          rc = Z_DATA_ERROR;  // bytes after the end of the compressed stream
          break;
        }
        continue;  // the next gzip member
      }
      if (rc != Z_OK) break;  // corrupt (Z_DATA_ERROR, ...) or truncated (Z_BUF_ERROR: no input left)
    }
    inflateEnd(&zs);
    return rc;
  };
  std::string out;
  int rc = inflate_with(e == "deflate" ? 15 : 15 + 16, e != "deflate", out);
  // "deflate" is zlib-wrapped (RFC 9110); some clients send raw deflate, which is tried second.
  if (rc != Z_STREAM_END && e == "deflate" && rc != kOverLimit) rc = inflate_with(-15, false, out);
  if (rc == kOverLimit)
    return DecodeError{413, "the decompressed request body exceeds " +
                                std::to_string(limits.max_decompressed_body_bytes) +
                                " bytes (--max-decompressed-body-bytes)"};
  if (rc != Z_STREAM_END)
    return DecodeError{400, "the request body is not valid " + e + " data (Content-Encoding: " + e + ")"};
  req.body = std::move(out);
  return std::nullopt;
}

}  // namespace polylora::server
