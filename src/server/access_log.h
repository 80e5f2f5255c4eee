// server/access_log.h: the HTTP access log, as uvicorn writes it under vLLM (`"POST /v1/completions
// HTTP/1.1" 200`, one line per request when its status is known). On with --uvicorn-log-level info (the
// default), debug or trace; off with warning and above, with --disable-uvicorn-access-log, and for the
// paths of --disable-access-log-for-endpoints.
// Must not: change what the wrapped responder sends.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/http_transport.h"

namespace polylora::server {

struct AccessLogConfig {
  bool enabled = true;
  std::vector<std::string> excluded_paths;  // exact paths, as vLLM's --disable-access-log-for-endpoints

  // From vLLM's flags: the level (critical|error|warning|info|debug|trace), the switch, and the
  // comma-separated path list.
  static AccessLogConfig from_flags(const std::string& uvicorn_log_level, bool disable_access_log,
                                    const std::string& excluded_endpoints);
  bool logs(const std::string& path) const;
};

// `res`, logging the request line and the status when the response starts (send or start_stream).
std::shared_ptr<HttpResponder> with_access_log(const HttpRequest& req, std::shared_ptr<HttpResponder> res);

}  // namespace polylora::server
