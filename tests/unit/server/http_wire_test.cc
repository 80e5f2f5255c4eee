// The HTTP/1.1 text the transport writes (server/http_wire.h): status lines, header values that try to
// split the response, chunk frames and header-name comparison.
#include "server/http_wire.h"

#include <gtest/gtest.h>

namespace polylora::server {
namespace {

TEST(HttpWire, StatusLineAndHeaders) {
  EXPECT_EQ(status_line_and_headers(429, "application/json", {{"Retry-After", "3"}}, true),
            "HTTP/1.1 429 Too Many Requests\r\nServer: polylora\r\nContent-Type: application/json\r\n"
            "Retry-After: 3\r\nConnection: keep-alive\r\n");
  EXPECT_EQ(status_line_and_headers(204, "", {}, false),
            "HTTP/1.1 204 No Content\r\nServer: polylora\r\nConnection: close\r\n");
  EXPECT_STREQ(reason_phrase(413), "Content Too Large");
  EXPECT_STREQ(reason_phrase(418), "Unknown");
}

TEST(HttpWire, HeaderValuesCannotSplitTheResponse) {
  // A value (e.g. a request id echoed back) carrying CR LF would start a header or body of its own.
  const std::string s = status_line_and_headers(200, "text/plain\r\nX-Evil: 1",
                                                {{"X-Request-Id", "a\r\n\r\nHTTP/1.1 200"}}, true);
  EXPECT_EQ(s,
            "HTTP/1.1 200 OK\r\nServer: polylora\r\nContent-Type: text/plainX-Evil: 1\r\n"
            "X-Request-Id: aHTTP/1.1 200\r\nConnection: keep-alive\r\n");
  EXPECT_EQ(header_safe("\r\n"), "");
}

TEST(HttpWire, ChunksAndHeaderNames) {
  EXPECT_EQ(chunk("data: {}\n\n"), "a\r\ndata: {}\n\n\r\n");
  EXPECT_EQ(chunk(std::string(300, 'x')), "12c\r\n" + std::string(300, 'x') + "\r\n");
  EXPECT_EQ(chunk(""), "0\r\n\r\n");  // the last chunk
  EXPECT_TRUE(iequals("Content-Length", "content-LENGTH"));
  EXPECT_FALSE(iequals("Content-Length", "Content-Lengths"));
  EXPECT_FALSE(iequals("a", "b"));
}

}  // namespace
}  // namespace polylora::server
