// server/http_wire.h: the HTTP/1.1 text the transport writes by hand (http_transport.cc): status lines
// with their reason phrases, header lines that cannot split a response, chunked-encoding frames, and the
// case-insensitive comparison of header names. Must not: know about the API or the engine.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace polylora::server {

// The reason phrase of a status code the server sends ("Unknown" for others).
const char* reason_phrase(int status);
// A header value as it may be written: CR and LF removed (no response splitting).
std::string header_safe(const std::string& v);
// "HTTP/1.1 <status> <reason>\r\n" and the header lines (Server, Content-Type when not empty, `headers`,
// Connection), each made header_safe; the blank line that ends the head is the caller's.
std::string status_line_and_headers(int status, const std::string& content_type,
                                    const std::vector<std::pair<std::string, std::string>>& headers,
                                    bool keep_alive);
// ASCII case-insensitive equality (header names).
bool iequals(std::string_view a, std::string_view b);
// One chunk of chunked transfer encoding: the size in hex, CRLF, the data, CRLF.
std::string chunk(const std::string& data);

}  // namespace polylora::server
