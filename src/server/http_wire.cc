// server/http_wire.cc: HTTP/1.1 response text (http_wire.h).
#include "server/http_wire.h"

#include <cctype>
#include <cstdio>

namespace polylora::server {

const char* reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Content";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

std::string header_safe(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v)
    if (c != '\r' && c != '\n') out += c;
  return out;
}

std::string status_line_and_headers(int status, const std::string& content_type,
                                    const std::vector<std::pair<std::string, std::string>>& headers,
                                    bool keep_alive) {
  std::string s = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  s += "Server: polylora\r\n";
  if (!content_type.empty()) s += "Content-Type: " + header_safe(content_type) + "\r\n";
  for (const auto& [k, v] : headers) s += header_safe(k) + ": " + header_safe(v) + "\r\n";
  s += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::string chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}

}  // namespace polylora::server
