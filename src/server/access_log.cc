// server/access_log.cc: see access_log.h.
#include "server/access_log.h"

#include <sstream>

#include "common/log.h"

namespace polylora::server {
namespace {

class AccessLogged : public HttpResponder {
 public:
  AccessLogged(std::string line, std::shared_ptr<HttpResponder> inner)
      : line_(std::move(line)), inner_(std::move(inner)) {}
  void send(HttpResponse response) override {
    log(response.status);
    inner_->send(std::move(response));
  }
  void start_stream(int status, std::string content_type,
                    std::vector<std::pair<std::string, std::string>> headers) override {
    log(status);
    inner_->start_stream(status, std::move(content_type), std::move(headers));
  }
  void write(std::string data) override { inner_->write(std::move(data)); }
  void end() override { inner_->end(); }
  bool disconnected() const override { return inner_->disconnected(); }
  void on_disconnect(std::function<void()> fn) override { inner_->on_disconnect(std::move(fn)); }

 private:
  void log(int status) const { spdlog::info("\"{}\" {}", line_, status); }
  std::string line_;
  std::shared_ptr<HttpResponder> inner_;
};

}  // namespace

AccessLogConfig AccessLogConfig::from_flags(const std::string& level, bool disable_access_log,
                                            const std::string& excluded_endpoints) {
  AccessLogConfig c;
  // uvicorn logs access lines at INFO: a level above it hides them.
  c.enabled = !disable_access_log && (level == "info" || level == "debug" || level == "trace");
  std::stringstream ss(excluded_endpoints);
  for (std::string p; std::getline(ss, p, ',');) {
    const auto b = p.find_first_not_of(" \t"), e = p.find_last_not_of(" \t");
    if (b != std::string::npos) c.excluded_paths.push_back(p.substr(b, e - b + 1));
  }
  return c;
}

bool AccessLogConfig::logs(const std::string& path) const {
  if (!enabled) return false;
  for (const std::string& p : excluded_paths)
    if (p == path) return false;
  return true;
}

std::shared_ptr<HttpResponder> with_access_log(const HttpRequest& req, std::shared_ptr<HttpResponder> res) {
  return std::make_shared<AccessLogged>(sanitize_utf8(req.method + " " + req.target) + " HTTP/1.1", std::move(res));
}

}  // namespace polylora::server
