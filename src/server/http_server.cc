// server/http_server.cc: routes of the OpenAI-compatible server, one short function each, registered from
// a table. Every body is parsed once (server/json_body.h); every exception becomes a JSON error response.
#include "server/http_server.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "lora/adapter.h"
#include "server/access_log.h"
#include "server/admin_api.h"
#include "server/api_error.h"
#include "server/generation.h"

namespace polylora::server {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  return r;
}

HttpResponse error_response(int status, const std::string& message) {
  return json_response(status, error_json(status, message));
}

HttpResponse text_response(std::string body, std::string content_type = "text/plain; charset=utf-8") {
  HttpResponse r;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  return r;
}

// Equal strings in time independent of where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(1, b.size())]);
  return diff == 0;
}

const char* content_type_of(const fs::path& p) {
  std::string ext = p.extension().string();
  if (ext == ".html") return "text/html; charset=utf-8";
  if (ext == ".js" || ext == ".mjs") return "text/javascript; charset=utf-8";
  if (ext == ".css") return "text/css; charset=utf-8";
  if (ext == ".json" || ext == ".map") return "application/json";
  if (ext == ".svg") return "image/svg+xml";
  if (ext == ".png") return "image/png";
  if (ext == ".ico") return "image/x-icon";
  if (ext == ".woff2") return "font/woff2";
  if (ext == ".txt") return "text/plain; charset=utf-8";
  return "application/octet-stream";
}

bool is_preflight(const HttpRequest& req) {
  return req.method == "OPTIONS" && req.header("origin") && req.header("access-control-request-method");
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string random_hex(size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += hex[rng() % 16];
  return s;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

struct HttpServer::Route {
  const char* method;
  const char* path;
  void (HttpServer::*fn)(HttpRequest&, const std::shared_ptr<HttpResponder>&);
};

HttpServer::HttpServer(ServerConfig config, EngineThread& engine,
                       std::shared_ptr<const tokenizer::Tokenizer> tokenizer, LoraLimits lora_limits)
    : config_(std::move(config)),
      engine_(engine),
      tokenizer_(std::move(tokenizer)),
      lora_limits_(lora_limits) {
  std::string source = config_.chat_template;
  if (!source.empty()) {
    std::ifstream in(source);
    if (!in) fail("--chat-template: cannot read {}", source);
    source.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else if (tokenizer_) {
    source = tokenizer_->chat_template();
  }
  if (!source.empty()) chat_template_ = ChatTemplate::compile(source);
  if (chat_template_) {
    const bool detected = config_.chat_template_content_format == "auto";
    const bool openai = detected ? chat_template_->content_format() == ChatContentFormat::kOpenai
                                 : config_.chat_template_content_format == "openai";
    spdlog::info("chat template content format: '{}'{}", openai ? "openai" : "string",
                 detected ? " (detected from the template; --chat-template-content-format sets it)" : "");
  }
  if (config_.served_model_names.empty()) config_.served_model_names.push_back("polylora");
  if (!config_.tool_call_parser.empty()) {
    auto kind = tool_parser_from_name(config_.tool_call_parser);
    if (!kind)
      fail("--tool-call-parser: unknown parser '{}' (polylora has {})", config_.tool_call_parser,
           tool_parser_names());
    tool_parser_ = *kind;
  }
  if (!config_.reasoning_parser.empty()) {
    auto kind = reasoning_parser_from_name(config_.reasoning_parser);
    if (!kind)
      fail("--reasoning-parser: unknown parser '{}' (polylora has {})", config_.reasoning_parser,
           reasoning_parser_names());
    reasoning_parser_ = *kind;
  }
  if (config_.enable_auto_tool_choice && tool_parser_ == ToolParserKind::kNone)
    fail("--enable-auto-tool-choice needs --tool-call-parser ({})", tool_parser_names());
  json_limits_.max_depth = static_cast<size_t>(std::max<int64_t>(1, config_.max_json_depth));
  json_limits_.max_keys_per_object = static_cast<size_t>(std::max<int64_t>(1, config_.max_json_keys));
  playground_ = !config_.web_root.empty() && fs::exists(fs::path(config_.web_root) / "index.html");
  if (playground_) spdlog::info("playground: serving {} at /", config_.web_root);

  HttpLimits limits;
  limits.max_connections = std::max<int64_t>(1, config_.max_connections);
  limits.max_header_bytes = static_cast<size_t>(std::max<int64_t>(256, config_.max_header_bytes));
  limits.max_header_count = static_cast<size_t>(std::max<int64_t>(1, config_.max_header_count));
  limits.max_body_bytes = static_cast<size_t>(std::max<int64_t>(0, config_.max_body_bytes));
  limits.max_decompressed_body_bytes =
      static_cast<size_t>(std::max<int64_t>(0, config_.max_decompressed_body_bytes));
  limits.header_timeout_s = config_.header_timeout;
  limits.body_timeout_s = config_.body_timeout;
  limits.keep_alive_timeout_s = config_.keep_alive_timeout;
  limits.write_timeout_s = config_.write_timeout;
  size_t workers = config_.http_worker_threads > 0
                       ? static_cast<size_t>(config_.http_worker_threads)
                       : std::clamp<size_t>(std::thread::hardware_concurrency(), 4, 16);
  AccessLogConfig access_log =
      AccessLogConfig::from_flags(config_.uvicorn_log_level, config_.disable_uvicorn_access_log,
                                  config_.disable_access_log_for_endpoints);
  if (!config_.default_chat_template_kwargs.empty()) {
    default_chat_template_kwargs_ = json::parse(config_.default_chat_template_kwargs, nullptr, false);
    if (!default_chat_template_kwargs_.is_object())
      fail("--default-chat-template-kwargs: expected a JSON object, got {}",
           config_.default_chat_template_kwargs);
  }
  transport_ = std::make_unique<HttpTransport>(
      limits,
      [this, access_log](HttpRequest& req, std::shared_ptr<HttpResponder> res) {
        handle(req, access_log.logs(req.path) ? with_access_log(req, std::move(res)) : res);
      },
      [](int status, const std::string& message) { return error_response(status, message); },
      static_cast<size_t>(std::max<int64_t>(1, config_.http_io_threads)), workers);
  // Authentication before anything else, a compressed body's inflation included.
  transport_->set_response_headers([this](const HttpRequest& req) { return response_headers(req); });
  transport_->set_precheck([this](const HttpRequest& req) -> std::optional<HttpResponse> {
    if (authorized(req)) return std::nullopt;
    return error_response(401, "Unauthorized: a valid API key is required (Authorization: Bearer <key>)");
  });
}

HttpServer::~HttpServer() = default;

bool HttpServer::listen() {
  try {
    bound_port_ = transport_->bind(config_.host, config_.port);
  } catch (const Error& e) {
    spdlog::error("{}", e.what());
    return false;
  }
  spdlog::info("serving the OpenAI API on http://{}:{} (models: {})", config_.host, bound_port_,
               config_.served_model_names.front());
  transport_->run();
  return true;
}

void HttpServer::begin_shutdown() {
  transport_->begin_shutdown();
}

void HttpServer::stop(std::chrono::milliseconds drain) {
  transport_->stop(drain);
}

bool HttpServer::authorized(const HttpRequest& req) const {
  const std::string& p = req.path;
  if (is_preflight(req)) return true;  // CORS preflights carry no credentials (vLLM lets OPTIONS through)
  std::vector<std::string> metrics_key;
  const std::vector<std::string>* keys = nullptr;
  if (p.rfind("/v1/", 0) == 0 || p == "/v1" || p == "/tokenize" || p == "/detokenize" ||
      p == "/invocations" || p == "/reset_prefix_cache" || p == "/server_info") {
    keys = &config_.api_keys;
  } else if (p == "/metrics" && !config_.metrics_api_key.empty()) {
    metrics_key = {config_.metrics_api_key};
    keys = &metrics_key;
  }
  if (!keys || keys->empty()) return true;
  // "Authorization: Bearer KEY", the scheme in any case (vLLM: scheme.lower() == "bearer").
  const std::string* auth = req.header("authorization");
  if (!auth) return false;
  const size_t space = auth->find(' ');
  if (space == std::string::npos) return false;
  std::string scheme = auth->substr(0, space);
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (scheme != "bearer") return false;
  const size_t start = auth->find_first_not_of(' ', space);
  const std::string token = start == std::string::npos ? std::string() : auth->substr(start);
  bool ok = false;
  for (const std::string& k : *keys) ok |= same_secret(token, k);  // every key compared: no early exit
  return ok;
}

void HttpServer::handle(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  static const Route kRoutes[] = {
      {"POST", "/v1/completions", &HttpServer::completions},
      {"POST", "/v1/chat/completions", &HttpServer::chat_completions},
      {"POST", "/v1/responses", &HttpServer::responses},
      {"GET", "/v1/models", &HttpServer::models},
      {"POST", "/v1/load_lora_adapter", &HttpServer::load_lora_adapter},
      {"POST", "/v1/unload_lora_adapter", &HttpServer::unload_lora_adapter},
      {"POST", "/tokenize", &HttpServer::tokenize},
      {"POST", "/detokenize", &HttpServer::detokenize},
      {"GET", "/health", &HttpServer::health},
      {"GET", "/version", &HttpServer::version},
      {"GET", "/metrics", &HttpServer::metrics},
      {"GET", "/ping", &HttpServer::ping},
      {"POST", "/ping", &HttpServer::ping},
      {"POST", "/invocations", &HttpServer::invocations},
      {"GET", "/server_info", &HttpServer::server_info},
      {"POST", "/reset_prefix_cache", &HttpServer::reset_prefix_cache},
  };
  try {
    if (is_preflight(req)) return res->send(preflight(req));
    if (!authorized(req))
      return res->send(
          error_response(401, "Unauthorized: a valid API key is required (Authorization: Bearer <key>)"));
    if (req.path.rfind("/v1/models/", 0) == 0 && req.path.size() > 11) {
      if (req.method == "GET") return model_by_id(req, res);
      return res->send(error_response(405, "method " + req.method + " is not allowed on " + req.path));
    }
    bool path_known = false;
    for (const Route& r : kRoutes) {
      if (req.path != r.path) continue;
      path_known = true;
      if (req.method == r.method) return (this->*r.fn)(req, res);
    }
    if (path_known)
      return res->send(error_response(405, "method " + req.method + " is not allowed on " + req.path));
    if (req.method == "GET" || req.method == "HEAD") return serve_static(req, res);
    res->send(error_response(404, "no route for " + req.method + " " + req.path));
  } catch (const Error& e) {
    res->send(error_response(status_of(e), e.what()));
  } catch (const nlohmann::json::exception& e) {
    res->send(error_response(400, std::string("invalid request: ") + e.what()));
  } catch (const std::bad_alloc&) {
    res->send(error_response(503, "the server is out of memory for this request; retry later"));
  } catch (const std::exception& e) {
    spdlog::error("{} {}: {}", req.method, sanitize_utf8(req.path), e.what());
    res->send(error_response(500, std::string("internal error: ") + e.what()));
  }
}

json HttpServer::body_json(const HttpRequest& req) const {
  return parse_json_body(req.body, json_limits_);
}

ParseContext HttpServer::parse_context() const {
  ParseContext ctx;
  ctx.tokenizer = tokenizer_.get();
  ctx.chat_template = chat_template_ ? &*chat_template_ : nullptr;
  ctx.served_model_names = config_.served_model_names;
  // With a resolver (--lora-resolver-dir), any other name goes to the engine, which loads it on first use
  // or refuses it as an unknown model.
  ctx.has_adapter = [this](const std::string& name) {
    return engine_.has_adapter(name) || engine_.resolves_adapters();
  };
  ctx.max_model_len = engine_.max_model_len();
  ctx.vocab_size = engine_.model_config().vocab_size;
  ctx.generation_defaults = &config_.generation_defaults;
  ctx.response_role = config_.response_role;
  ctx.return_tokens_as_token_ids = config_.return_tokens_as_token_ids;
  ctx.force_include_usage = config_.enable_force_include_usage;
  ctx.default_chat_template_kwargs = default_chat_template_kwargs_;
  ctx.enable_auto_tool_choice = config_.enable_auto_tool_choice;
  ctx.exclude_tools_when_tool_choice_none = config_.exclude_tools_when_tool_choice_none;
  if (config_.chat_template_content_format == "string") ctx.content_format = ChatContentFormat::kString;
  if (config_.chat_template_content_format == "openai") ctx.content_format = ChatContentFormat::kOpenai;
  ctx.tool_parser = tool_parser_;
  ctx.reasoning_parser = reasoning_parser_;
  return ctx;
}

void HttpServer::start_generation(ParsedRequest parsed, const HttpRequest& req,
                                  const std::shared_ptr<HttpResponder>& res) {
  // vLLM: the X-Request-Id header, else the body's request_id, else a random id, after "cmpl-" / "chatcmpl-".
  if (const std::string* h = req.header("x-request-id"); h && !h->empty()) parsed.request_id = *h;
  auto g = std::make_shared<Generation>(
      std::move(parsed), engine_, tokenizer_.get(), res,
      [this](std::function<void()> fn) { transport_->post_work(std::move(fn)); });
  g->start();
}

void HttpServer::completions(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  start_generation(parse_completion(body_json(req), parse_context()), req, res);
}

void HttpServer::chat_completions(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  start_generation(parse_chat(body_json(req), parse_context()), req, res);
}

void HttpServer::responses(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  start_generation(parse_responses(body_json(req), parse_context()), req, res);
}

// SageMaker's inference route, as vLLM routes it: a body with `messages` is a chat completion, one with
// `prompt` a completion.
void HttpServer::invocations(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  json body = body_json(req);
  if (!body.is_object()) fail("the request body must be a JSON object");
  if (body.contains("messages")) return start_generation(parse_chat(body, parse_context()), req, res);
  if (body.contains("prompt")) return start_generation(parse_completion(body, parse_context()), req, res);
  fail("/invocations: the body needs 'messages' (chat completions) or 'prompt' (completions)");
}

void HttpServer::ping(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  health(req, res);
}

void HttpServer::server_info(HttpRequest&, const std::shared_ptr<HttpResponder>& res) {
  const ModelConfig& m = engine_.model_config();
  json model = {{"model_type", m.model_type},
                {"vocab_size", m.vocab_size},
                {"hidden_size", m.hidden_size},
                {"num_layers", m.num_layers},
                {"num_heads", m.num_heads},
                {"num_kv_heads", m.num_kv_heads},
                {"head_dim", m.head_dim},
                {"max_position_embeddings", m.max_position_embeddings},
                {"max_model_len", engine_.max_model_len()}};
  json cache = json::object();
  for (const auto& [k, v] : engine_.snapshot().cache_config) cache[k] = v;
  json server = {{"served_model_names", config_.served_model_names},
                 {"model", config_.model_root},
                 {"allowed_origins", config_.allowed_origins},
                 {"allowed_methods", config_.allowed_methods},
                 {"allowed_headers", config_.allowed_headers},
                 {"allow_credentials", config_.allow_credentials},
                 {"enable_request_id_headers", config_.enable_request_id_headers},
                 {"runtime_lora_updating", config_.allow_runtime_lora_updating}};
  res->send(json_response(200, {{"version", POLYLORA_VERSION_STRING},
                                {"model_config", model},
                                {"cache_config", cache},
                                {"server_config", server}}));
}

void HttpServer::reset_prefix_cache(HttpRequest&, const std::shared_ptr<HttpResponder>& res) {
  engine_.reset_prefix_cache();
  spdlog::info("prefix cache reset");
  res->send(text_response("", ""));
}

json HttpServer::model_cards() const {
  int64_t created = static_cast<int64_t>(std::time(nullptr));
  // vLLM's ModelPermission, one per card.
  auto permission = [&] {
    return json::array({{{"id", "modelperm-" + random_hex(32)},
                         {"object", "model_permission"},
                         {"created", created},
                         {"allow_create_engine", false},
                         {"allow_sampling", true},
                         {"allow_logprobs", true},
                         {"allow_search_indices", false},
                         {"allow_view", true},
                         {"allow_fine_tuning", false},
                         {"organization", "*"},
                         {"group", nullptr},
                         {"is_blocking", false}}});
  };
  json data = json::array();
  for (const auto& name : config_.served_model_names)
    data.push_back({{"id", name},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "vllm"},  // vLLM's ModelCard (clients compare it)
                    {"root", config_.model_root.empty() ? name : config_.model_root},
                    {"parent", nullptr},
                    {"max_model_len", engine_.max_model_len()},
                    {"permission", permission()}});
  // Every registered adapter (resolver-loaded ones once loaded) with where its weights are now:
  // "gpu" (a device slot), "cpu" (host memory) or "disk" (read again on its next use).
  // As vLLM's adapter cards: parent is --lora-modules' base_model_name (else the served name), and
  // max_model_len is not set on them.
  for (const auto& a : engine_.snapshot().adapters) {
    auto parent = config_.lora_parents.find(a.name);
    data.push_back({{"id", a.name},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "vllm"},
                    {"root", a.path},
                    {"parent", parent != config_.lora_parents.end() ? parent->second
                                                                    : config_.served_model_names.front()},
                    {"max_model_len", nullptr},
                    {"permission", permission()},
                    {"residency", a.tier}});
  }
  return data;
}

void HttpServer::models(HttpRequest&, const std::shared_ptr<HttpResponder>& res) {
  res->send(json_response(200, {{"object", "list"}, {"data", model_cards()}}));
}

// GET /v1/models/{id} (OpenAI's "retrieve model"): the one model object, or a 404 as OpenAI's.
void HttpServer::model_by_id(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  std::string id = percent_decode(req.path.substr(std::string("/v1/models/").size()));
  for (const auto& card : model_cards())
    if (card["id"] == id) return res->send(json_response(200, card));
  json err = error_json(404, "The model `" + sanitize_utf8(id) + "` does not exist.");
  err["error"]["param"] = "model";
  err["error"]["code"] = "model_not_found";
  res->send(json_response(404, err));
}

bool HttpServer::origin_allowed(const std::string& origin) const {
  return contains(config_.allowed_origins, "*") || contains(config_.allowed_origins, origin);
}

std::vector<std::pair<std::string, std::string>> HttpServer::response_headers(const HttpRequest& req) const {
  std::vector<std::pair<std::string, std::string>> h;
  if (config_.enable_request_id_headers) {
    const std::string* rid = req.header("x-request-id");
    h.emplace_back("X-Request-Id", rid && !rid->empty() ? *rid : random_hex(32));
  }
  const std::string* origin = req.header("origin");
  if (!origin || is_preflight(req)) return h;
  // Starlette's simple response: "*" when every origin is allowed (the origin itself when the request
  // carries cookies), the origin itself (with Vary) when it is listed, nothing otherwise.
  const bool all = contains(config_.allowed_origins, "*");
  if (all && !req.header("cookie")) h.emplace_back("Access-Control-Allow-Origin", "*");
  if (config_.allow_credentials) h.emplace_back("Access-Control-Allow-Credentials", "true");
  if ((all && req.header("cookie")) || (!all && origin_allowed(*origin))) {
    h.emplace_back("Access-Control-Allow-Origin", *origin);
    h.emplace_back("Vary", "Origin");
  }
  return h;
}

HttpResponse HttpServer::preflight(const HttpRequest& req) const {
  static const std::vector<std::string> kAllMethods = {"DELETE", "GET",  "HEAD", "OPTIONS",
                                                       "PATCH",  "POST", "PUT"};
  const std::string& origin = *req.header("origin");
  const std::string& method = *req.header("access-control-request-method");
  const std::string* requested_headers = req.header("access-control-request-headers");
  const bool all_origins = contains(config_.allowed_origins, "*");
  const bool explicit_origin = !all_origins || config_.allow_credentials;
  const std::vector<std::string>& methods =
      contains(config_.allowed_methods, "*") ? kAllMethods : config_.allowed_methods;
  const bool all_headers = contains(config_.allowed_headers, "*");
  // Starlette: the safelisted headers and the configured ones, sorted as given (the header's value), and
  // compared in lower case.
  std::vector<std::string> listed = {"Accept", "Accept-Language", "Content-Language", "Content-Type"};
  for (const auto& h : config_.allowed_headers)
    if (!contains(listed, h)) listed.push_back(h);
  std::sort(listed.begin(), listed.end());
  std::vector<std::string> allow_headers;
  for (const auto& h : listed) allow_headers.push_back(lower(h));

  HttpResponse r;
  r.content_type = "text/plain; charset=utf-8";
  if (explicit_origin)
    r.headers.emplace_back("Vary", "Origin");
  else
    r.headers.emplace_back("Access-Control-Allow-Origin", "*");
  std::string joined;
  for (const auto& m : methods) joined += (joined.empty() ? "" : ", ") + m;
  r.headers.emplace_back("Access-Control-Allow-Methods", joined);
  r.headers.emplace_back("Access-Control-Max-Age", "600");
  if (!all_headers) {
    std::string hs;
    for (const auto& h : listed) hs += (hs.empty() ? "" : ", ") + h;
    r.headers.emplace_back("Access-Control-Allow-Headers", hs);
  }
  if (config_.allow_credentials) r.headers.emplace_back("Access-Control-Allow-Credentials", "true");
  std::vector<std::string> failures;
  if (origin_allowed(origin)) {
    if (explicit_origin) r.headers.emplace_back("Access-Control-Allow-Origin", origin);
  } else {
    failures.push_back("origin");
  }
  if (!contains(methods, method)) failures.push_back("method");
  if (all_headers && requested_headers) {
    r.headers.emplace_back("Access-Control-Allow-Headers", *requested_headers);
  } else if (requested_headers) {
    std::string list = lower(*requested_headers);
    size_t pos = 0;
    while (pos <= list.size()) {
      size_t comma = list.find(',', pos);
      std::string h = trim(list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
      if (!contains(allow_headers, h)) {
        failures.push_back("headers");
        break;
      }
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  }
  if (!failures.empty()) {
    r.status = 400;
    r.body = "Disallowed CORS ";
    for (size_t i = 0; i < failures.size(); ++i) r.body += (i ? ", " : "") + failures[i];
  } else {
    r.body = "OK";
  }
  return r;
}

void HttpServer::load_lora_adapter(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  if (!config_.allow_runtime_lora_updating)
    fail_with(ErrorKind::kNotFound,
              "runtime LoRA loading is disabled; start the server with --enable-lora-runtime-updating (or "
              "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) and --lora-allowed-dirs");
  auto [name, path] = load_adapter_request(body_json(req));
  for (const auto& served : config_.served_model_names)
    if (served == name) fail("'{}' is the base model's name; choose another adapter name", name);
  if (engine_.has_adapter(name)) fail("The lora adapter '{}' has already been loaded.", name);
  if (config_.lora_allowed_dirs.empty())
    fail(
        "loading adapters at run time needs --lora-allowed-dirs DIR...: no directory is allowed, so '{}' "
        "cannot be read",
        path);
  // A relative lora_path is relative to the server's working directory, as in vLLM; the confined loader
  // then refuses it unless it lies inside an allowed directory.
  std::string where =
      fs::path(path).is_absolute() ? path : (fs::current_path() / path).lexically_normal().string();
  auto adapter = load_peft_adapter_confined(config_.lora_allowed_dirs, where, name, engine_.model_config(),
                                            lora_limits_);
  adapter->path = path;
  // Read again from the same confined place after the host tier evicted it.
  engine_.add_adapter(std::move(adapter), [dirs = config_.lora_allowed_dirs, where, name,
                                           mc = engine_.model_config(), limits = lora_limits_] {
    return load_peft_adapter_confined(dirs, where, name, mc, limits);
  });
  spdlog::info("loaded adapter '{}' from {}", sanitize_utf8(name), sanitize_utf8(path));
  res->send(text_response("Success: LoRA adapter '" + sanitize_utf8(name) + "' added successfully."));
}

void HttpServer::unload_lora_adapter(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  if (!config_.allow_runtime_lora_updating)
    fail_with(ErrorKind::kNotFound,
              "runtime LoRA loading is disabled; start the server with --enable-lora-runtime-updating (or "
              "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) and --lora-allowed-dirs");
  std::string name = unload_adapter_request(body_json(req));
  if (!engine_.remove_adapter(name))
    fail_with(ErrorKind::kNotFound, "The lora adapter '{}' cannot be found.", name);
  res->send(text_response("Success: LoRA adapter '" + sanitize_utf8(name) + "' removed successfully."));
}

void HttpServer::tokenize(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  TokenizeResult t = tokenize_request(body_json(req), parse_context());
  json out = {{"count", t.ids.size()}, {"max_model_len", engine_.max_model_len()}, {"tokens", t.ids}};
  if (t.return_token_strs) {
    json list = json::array();
    for (int32_t id : t.ids) list.push_back(tokenizer_->id_to_token(id));
    out["token_strs"] = list;
  } else {
    out["token_strs"] = nullptr;
  }
  res->send(json_response(200, out));
}

void HttpServer::detokenize(HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  std::vector<int32_t> ids = detokenize_request(body_json(req), parse_context());
  if (!tokenizer_) fail("this server has no tokenizer");
  res->send(json_response(200, {{"prompt", tokenizer_->decode(ids)}}));
}

void HttpServer::health(HttpRequest&, const std::shared_ptr<HttpResponder>& res) {
  res->send(text_response("", ""));
}

void HttpServer::version(HttpRequest&, const std::shared_ptr<HttpResponder>& res) {
  res->send(json_response(200, {{"version", POLYLORA_VERSION_STRING}}));
}

void HttpServer::metrics(HttpRequest&, const std::shared_ptr<HttpResponder>& res) {
  res->send(text_response(prometheus_text(engine_.snapshot(), config_.served_model_names.front()),
                          "text/plain; version=0.0.4; charset=utf-8"));
}

// The browser playground (web/, built by `npm run build` into web/dist): static files from --web-root,
// without authentication (its API calls carry the key). Only regular files below the root are served.
void HttpServer::serve_static(const HttpRequest& req, const std::shared_ptr<HttpResponder>& res) {
  std::string rel = req.path == "/" ? "index.html" : req.path.substr(1);
  bool safe = playground_ && !rel.empty() && rel.find('\0') == std::string::npos &&
              rel.find('%') == std::string::npos && rel.find('\\') == std::string::npos;
  if (safe)
    for (const auto& part : fs::path(rel))
      if (part == ".." || part == ".") safe = false;
  if (safe) {
    fs::path file = fs::path(config_.web_root) / rel;
    std::error_code ec;
    if (fs::is_regular_file(fs::symlink_status(file, ec)) && !ec) {
      std::ifstream in(file, std::ios::binary);
      std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (in.good() || in.eof()) return res->send(text_response(std::move(data), content_type_of(file)));
    }
  }
  if (req.path == "/") return playground_missing(const_cast<HttpRequest&>(req), res);
  res->send(error_response(404, "no route for " + req.method + " " + req.path));
}

void HttpServer::playground_missing(HttpRequest&, const std::shared_ptr<HttpResponder>& res) {
  std::string where = config_.web_root.empty() ? std::string("(disabled: --web-root '')") : config_.web_root;
  res->send(text_response(
      "<!doctype html><meta charset=utf-8><title>polylora</title><h1>polylora</h1>"
      "<p>The browser playground is not built: no <code>index.html</code> in <code>" +
          sanitize_utf8(where) +
          "</code>.</p><p>Build it with <code>npm ci &amp;&amp; npm run build</code> in the repository's "
          "<code>web/</code> folder (or <code>./scripts/build_web.sh</code>), or point "
          "<code>--web-root</code> at a built copy. The OpenAI API is at <code>/v1</code>.</p>",
      "text/html; charset=utf-8"));
}

}  // namespace polylora::server
