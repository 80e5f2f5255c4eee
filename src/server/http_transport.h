// server/http_transport.h: the event-driven HTTP/1.1 transport under the OpenAI server (Boost.Asio for
// sockets and timers, Boost.Beast's parser for request framing). A few I/O threads serve every
// connection; no thread is held by a slow or idle client. Owns: accepting, the connection limit (idle and
// slow connections shed first), total deadlines for a request's headers and body, size limits (header
// bytes and count, body, decompressed body), gzip/deflate request bodies, keep-alive, response writing
// (whole or chunked streams), disconnect detection while a request runs, and shutdown.
// Must not: know about JSON, OpenAI routes or the engine (handlers do; see http_server.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/utf8.h"  // sanitize_utf8

namespace polylora::server {

// Limits of the transport, each with a flag in `polylora serve` (defaults close to vLLM's uvicorn + h11).
struct HttpLimits {
  int64_t max_connections = 16384;                 // open connections; at the limit the idlest is shed
  size_t max_header_bytes = 16 * 1024;             // request line + header fields (h11: 16 KiB)
  size_t max_header_count = 100;                   // header fields per request
  size_t max_body_bytes = 32u << 20;               // body as sent (Content-Length or chunked)
  size_t max_decompressed_body_bytes = 64u << 20;  // body after gzip/deflate
  double header_timeout_s = 10;                    // total time for the request line and headers
  double body_timeout_s = 60;                      // total time for the body
  double keep_alive_timeout_s = 5;                 // idle time between requests (uvicorn: 5 s)
  double write_timeout_s = 60;                     // a response write making no progress this long closes
};

struct HttpRequest {
  std::string method;                                        // "GET", "POST", ...
  std::string target;                                        // as sent (may hold any bytes)
  std::string path;                                          // target up to '?'
  std::string query;                                         // after '?'
  std::vector<std::pair<std::string, std::string>> headers;  // field names lower-cased
  std::string body;                                          // gzip/deflate already undone
  // The value of a header field (name in lower case), or nullptr.
  const std::string* header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

// The answer channel of one request. Thread-safe; never blocks (writes are queued to the I/O thread).
// Call send() once, or start_stream(), any number of write(), then end().
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void send(HttpResponse response) = 0;
  virtual void start_stream(int status, std::string content_type,
                            std::vector<std::pair<std::string, std::string>> headers) = 0;
  virtual void write(std::string data) = 0;
  virtual void end() = 0;
  // True once the client has gone (closed, reset, or stopped reading for write_timeout_s).
  virtual bool disconnected() const = 0;
  // `fn` runs once, on a worker thread, when the client goes before the response is complete (at once if
  // it already has).
  virtual void on_disconnect(std::function<void()> fn) = 0;
};

// Handles one complete request; runs on a worker thread (never an I/O thread), may keep the responder and
// answer later from any thread.
using HttpHandler = std::function<void(HttpRequest& request, std::shared_ptr<HttpResponder> responder)>;
// Builds the body of an error the transport answers by itself (400, 408, 413, 415, 431, 503).
using HttpErrorBody = std::function<HttpResponse(int status, const std::string& message)>;

// Looks at a request before its body is decoded (e.g. authentication): a response answers it at once.
using HttpPrecheck = std::function<std::optional<HttpResponse>(const HttpRequest& request)>;

// Header fields added to every response of a request (CORS, request ids): computed from the request on a
// worker before anything else runs.
using HttpResponseHeaders =
    std::function<std::vector<std::pair<std::string, std::string>>(const HttpRequest& request)>;

class HttpTransport {
 public:
  HttpTransport(HttpLimits limits, HttpHandler handler, HttpErrorBody error_body, size_t num_io_threads,
                size_t num_worker_threads);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds and listens; returns the bound port (useful with port 0). Throws polylora::Error on failure.
  int bind(const std::string& host, int port);
  // Serves until stop() has finished; returns then.
  void run();
  // Stops accepting, closes idle connections and those still sending a request; running requests go on
  // and their connections close after the response. Safe from any thread.
  void begin_shutdown();
  // begin_shutdown(), then after `drain` closes every connection and makes run() return.
  void stop(std::chrono::milliseconds drain);
  // Set before run(): called on a worker for every request before gzip/deflate bodies are inflated.
  void set_precheck(HttpPrecheck precheck);
  // Set before run(): the header fields added to every response the handler (or the precheck) gives.
  void set_response_headers(HttpResponseHeaders fn);
  // Runs `fn` on the worker pool.
  void post_work(std::function<void()> fn);
  int64_t num_connections() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace polylora::server
