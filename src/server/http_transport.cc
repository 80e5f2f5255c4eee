// server/http_transport.cc: the event-driven HTTP/1.1 transport (see the header). Every connection is a
// Session whose handlers run on its own strand; one timer per session enforces the phase deadlines
// (idle keep-alive, total header time, total body time, write progress). Requests are parsed by Beast's
// request_parser (header and body limits, chunked framing); handlers run on a worker pool.
#include "server/http_transport.h"

#include <sys/resource.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <list>
#include <mutex>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "server/content_encoding.h"
#include "server/http_wire.h"

namespace polylora::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

const std::string* HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

class Session;

struct HttpTransport::Impl : std::enable_shared_from_this<HttpTransport::Impl> {
  Impl(HttpLimits l, HttpHandler h, HttpErrorBody e, size_t io, size_t workers_n)
      : limits(l),
        handler(std::move(h)),
        error_body(std::move(e)),
        num_io_threads(std::max<size_t>(1, io)),
        workers(std::max<size_t>(1, workers_n)),
        acceptor(ioc),
        retry_timer(ioc),
        stop_timer(ioc),
        work(net::make_work_guard(ioc)) {}

  void do_accept();
  bool shed_one();
  void close_all(bool only_unbusy);
  // Work that throws is a bug: logged, never allowed to end the process.
  void post_work(std::function<void()> fn) {
    net::post(workers, [fn = std::move(fn)] {
      try {
        fn();
      } catch (const std::exception& e) {
        spdlog::error("HTTP worker task failed: {}", e.what());
      } catch (...) {
        spdlog::error("HTTP worker task failed");
      }
    });
  }

  HttpLimits limits;
  HttpHandler handler;
  HttpErrorBody error_body;
  HttpPrecheck precheck;
  HttpResponseHeaders response_headers;
  size_t num_io_threads;
  net::thread_pool workers;
  net::io_context ioc;
  tcp::acceptor acceptor;
  net::steady_timer retry_timer;
  net::steady_timer stop_timer;
  net::executor_work_guard<net::io_context::executor_type> work;
  std::atomic<bool> shutting_down{false};
  std::mutex mu;
  std::list<std::weak_ptr<Session>> sessions;
  std::atomic<int64_t> num_sessions{0};
};

// The answer channel handed to a handler; forwards to the session's strand.
class Responder : public HttpResponder {
 public:
  Responder(std::weak_ptr<Session> session, net::any_io_executor ex, HttpTransport::Impl* t)
      : session_(std::move(session)), ex_(std::move(ex)), t_(t) {}
  void send(HttpResponse response) override;
  void start_stream(int status, std::string content_type,
                    std::vector<std::pair<std::string, std::string>> headers) override;
  void write(std::string data) override;
  void end() override;
  bool disconnected() const override { return gone_.load(); }
  // Set once on the worker before the handler runs.
  void set_extra_headers(std::vector<std::pair<std::string, std::string>> h) { extra_ = std::move(h); }
  void on_disconnect(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (gone_.load()) {
      lock.unlock();
      t_->post_work(std::move(fn));
      return;
    }
    on_gone_ = std::move(fn);
  }
  // Called by the session when the client goes before the response is complete.
  void fire_disconnect() {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gone_.exchange(true)) return;
      fn = std::move(on_gone_);
    }
    if (fn) t_->post_work(std::move(fn));
  }

 private:
  std::weak_ptr<Session> session_;
  net::any_io_executor ex_;
  HttpTransport::Impl* t_;
  std::mutex mu_;
  std::atomic<bool> gone_{false};
  std::function<void()> on_gone_;
  std::vector<std::pair<std::string, std::string>> extra_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  enum State : int { kIdle, kHeader, kBody, kHandling, kClosing, kClosed };

  Session(std::shared_ptr<HttpTransport::Impl> t, tcp::socket socket)
      : t_(std::move(t)), sock_(std::move(socket)), timer_(sock_.get_executor()) {}

  net::any_io_executor executor() { return sock_.get_executor(); }
  int state() const { return state_atomic_.load(); }
  int64_t since() const { return since_ns_.load(); }

  void start() {
    request_start_ = Clock::now();
    do_idle(request_start_ + seconds(t_->limits.header_timeout_s));
  }

  // Answers 503 at once (the connection limit is reached and nothing could be shed).
  void reject() {
    set_state(kHandling);
    keep_alive_ = false;
    HttpResponse r = t_->error_body(503, "the server has too many open connections (--max-connections " +
                                             std::to_string(t_->limits.max_connections) + "); retry later");
    queue_response(std::move(r));
  }

  // From any thread.
  void request_close() {
    net::post(sock_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

  // --- called on the strand by the Responder ---
  void queue_response(HttpResponse r) {
    if (state_ == kClosed || response_started_) return;
    response_started_ = true;
    bool ka = keep_alive_ && !t_->shutting_down.load();
    keep_alive_ = ka;
    std::string s = status_line_and_headers(r.status, r.content_type, r.headers, ka);
    s += "Content-Length: " + std::to_string(r.body.size()) + "\r\n\r\n";
    if (!head_request_) s += r.body;  // HEAD: the headers (with the length) only
    queue(std::move(s), true);
  }
  void queue_stream_start(int status, const std::string& content_type,
                          const std::vector<std::pair<std::string, std::string>>& headers) {
    if (state_ == kClosed || response_started_) return;
    response_started_ = true;
    streaming_ = true;
    std::string s = status_line_and_headers(status, content_type, headers, keep_alive_);
    s += "Transfer-Encoding: chunked\r\n\r\n";
    queue(std::move(s), false);
  }
  void queue_chunk(const std::string& data) {
    if (state_ == kClosed || !streaming_ || complete_ || data.empty()) return;
    queue(chunk(data), false);
  }
  void queue_stream_end() {
    if (state_ == kClosed || !streaming_ || complete_) return;
    queue("0\r\n\r\n", true);
  }

  // Callers hold a reference to the session (an async handler's `self`), so dropping hold_ here is safe.
  void close() {
    if (state_ == kClosed) return;
    set_state(kClosed);
    hold_.reset();
    disarm();
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    if (responder_) {
      responder_->fire_disconnect();
      responder_.reset();
    }
    unregister();
  }

  std::list<std::weak_ptr<Session>>::iterator reg_it;
  bool registered = false;

 private:
  void set_state(State s) {
    state_ = s;
    state_atomic_.store(s);
    since_ns_.store(Clock::now().time_since_epoch().count());
  }

  void unregister() {
    std::lock_guard<std::mutex> lock(t_->mu);
    if (registered) {
      t_->sessions.erase(reg_it);
      registered = false;
      t_->num_sessions.fetch_sub(1);
    }
  }

  void arm_until(Clock::time_point deadline) {
    uint64_t gen = ++timer_gen_;
    timer_.expires_at(deadline);
    timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
      if (ec || gen != self->timer_gen_) return;
      self->on_timeout();
    });
  }
  void disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  void on_timeout() {
    switch (state_) {
      case kIdle:
      case kClosing:
        close();
        return;
      case kHeader:
      case kBody:
        // The pending read ends with operation_aborted and on_read_error answers 408. A read that had just
        // completed (its handler queued on this strand) is not cancelled, and the composed header or body
        // read then starts another one: check again shortly (the answer disarms this), so a client that
        // keeps trickling bytes cannot slip past the deadline.
        timed_out_ = true;
        {
          beast::error_code ec;
          sock_.cancel(ec);
        }
        arm_until(Clock::now() + std::chrono::milliseconds(50));
        return;
      case kHandling:  // a write made no progress
        close();
        return;
      case kClosed:
        return;
    }
  }

  // Waits for the first byte of the next request (or reads it from the buffer).
  void do_idle(Clock::time_point deadline) {
    set_state(kIdle);
    if (t_->shutting_down.load()) return close();
    if (buf_.size() > 0) {
      // The next request is buffered. A read started while the last one was handled may still be pending
      // (it watches for the client going away); cancel it first, on_read_some then goes on with do_header.
      if (reading_) {
        resume_header_ = true;
        beast::error_code ec;
        sock_.cancel(ec);
        return;
      }
      return do_header();
    }
    arm_until(deadline);
    if (!reading_) start_read_some();
  }

  // Bytes of pipelined requests buffered while one is handled; reading stops there (TCP pushes back).
  size_t pipeline_cap() const { return std::max<size_t>(t_->limits.max_header_bytes, 16 * 1024); }

  void start_read_some() {
    reading_ = true;
    sock_.async_read_some(buf_.prepare(16 * 1024),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            self->reading_ = false;
                            self->buf_.commit(n);
                            self->on_read_some(ec);
                          });
  }

  void on_read_some(beast::error_code ec) {
    if (state_ == kClosed) return;
    if (state_ == kClosing) {  // lingering close: discard until EOF
      buf_.consume(buf_.size());
      if (ec) return close();
      return start_read_some();
    }
    if (resume_header_ && state_ == kIdle && (!ec || ec == net::error::operation_aborted)) {
      request_start_ = Clock::now();
      return do_header();  // cancelled by do_idle: the next request is already buffered
    }
    if (ec) return close();  // EOF or reset: the client has gone (close() tells a running request)
    if (state_ == kIdle) {
      request_start_ = Clock::now();
      return do_header();
    }
    // kHandling: a pipelined request arrived; keep it for after this response, and go on watching for the
    // client going away while the buffer is small.
    if (state_ == kHandling && buf_.size() < pipeline_cap()) start_read_some();
  }

  void do_header() {
    set_state(kHeader);
    resume_header_ = false;
    timed_out_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(
        std::min<size_t>(t_->limits.max_header_bytes, std::numeric_limits<std::uint32_t>::max())));
    parser_->body_limit(t_->limits.max_body_bytes);
    arm_until(request_start_ + seconds(t_->limits.header_timeout_s));
    reading_ = true;
    http::async_read_header(sock_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->reading_ = false;
      self->on_header(ec);
    });
  }

  void on_header(beast::error_code ec) {
    if (state_ == kClosed) return;
    if (ec) return on_read_error(ec);
    size_t count = 0;
    for (auto it = parser_->get().begin(); it != parser_->get().end(); ++it) ++count;
    if (count > t_->limits.max_header_count)
      return respond_error(431, "the request has " + std::to_string(count) + " header fields; at most " +
                                    std::to_string(t_->limits.max_header_count) +
                                    " are allowed (--max-header-count)");
    // Only the chunked transfer coding is implemented: any other (gzip, identity, a list) would be passed
    // on undecoded, or framed differently by a proxy in front (request smuggling). 400 for all of them
    // (RFC 9112 6.1 has 501 for an unknown coding, 400 when chunked is not last; one status is simpler).
    for (const auto& f : parser_->get()) {
      if (f.name() != http::field::transfer_encoding) continue;
      std::string_view v(f.value().data(), f.value().size());
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
      if (!iequals(v, "chunked"))
        return respond_error(400,
                             "Transfer-Encoding '" + sanitize_utf8(v) +
                                 "' is not supported (only 'chunked' is; use Content-Encoding for gzip)");
    }
    if (parser_->is_done()) return dispatch();
    auto expect = parser_->get()[http::field::expect];
    if (beast::iequals(expect, "100-continue")) {
      continue_ = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      writing_ = true;
      net::async_write(sock_, net::buffer(*continue_),
                       [self = shared_from_this()](beast::error_code ec, size_t) {
                         self->writing_ = false;
                         if (ec) return self->close();
                         self->do_body();
                       });
      return;
    }
    do_body();
  }

  void do_body() {
    if (state_ == kClosed) return;
    set_state(kBody);
    timed_out_ = false;
    arm_until(Clock::now() + seconds(t_->limits.body_timeout_s));
    reading_ = true;
    http::async_read(sock_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->reading_ = false;
      if (self->state_ == kClosed) return;
      if (ec) return self->on_read_error(ec);
      self->dispatch();
    });
  }

  void on_read_error(beast::error_code ec) {
    bool in_body = state_ == kBody;
    if (timed_out_)
      return respond_error(408, in_body ? "the request body was not received within " +
                                              fmt::format("{:g}", t_->limits.body_timeout_s) + " s"
                                        : "the request headers were not received within " +
                                              fmt::format("{:g}", t_->limits.header_timeout_s) + " s");
    if (ec == http::error::header_limit)
      return respond_error(431, "the request line and headers exceed " +
                                    std::to_string(t_->limits.max_header_bytes) +
                                    " bytes (--max-header-bytes)");
    if (ec == http::error::body_limit)
      return respond_error(413, "the request body exceeds " + std::to_string(t_->limits.max_body_bytes) +
                                    " bytes (--max-body-bytes)");
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == net::error::eof ||
        ec == net::error::operation_aborted ||
        &ec.category() != &http::make_error_code(http::error::bad_method).category())
      return close();  // the client went away (or a socket error)
    respond_error(400, "malformed HTTP request: " + ec.message());
  }

  // An error the transport answers itself; the connection closes after it.
  void respond_error(int status, const std::string& message) {
    disarm();
    set_state(kHandling);
    hold_ = shared_from_this();
    keep_alive_ = false;
    head_request_ = false;
    response_started_ = false;
    complete_ = false;
    streaming_ = false;
    queue_response(t_->error_body(status, message));
  }

  void dispatch() {
    disarm();
    set_state(kHandling);
    // While the handler runs the session may have no pending operation (no read when the next request is
    // already buffered, no write between stream chunks); the Responder only holds a weak reference.
    hold_ = shared_from_this();
    response_started_ = false;
    complete_ = false;
    streaming_ = false;
    auto msg = parser_->release();
    parser_.reset();
    keep_alive_ = msg.keep_alive() && !t_->shutting_down.load();
    head_request_ = msg.method() == http::verb::head;
    HttpRequest req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    // absolute-form (RFC 9112 3.2.2: servers must accept it): routes see the path only.
    std::string_view origin = req.target;
    for (std::string_view scheme : {"http://", "https://"}) {
      if (origin.size() >= scheme.size() && iequals(origin.substr(0, scheme.size()), scheme)) {
        size_t slash = origin.find_first_of("/?", scheme.size());
        origin = slash == std::string_view::npos ? std::string_view("/") : origin.substr(slash);
        break;
      }
    }
    size_t q = origin.find('?');
    req.path = std::string(origin.substr(0, q));
    if (req.path.empty()) req.path = "/";
    if (q != std::string_view::npos) req.query = std::string(origin.substr(q + 1));
    for (const auto& f : msg) {
      std::string name(f.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      req.headers.emplace_back(std::move(name), std::string(f.value()));
    }
    req.body = std::move(msg.body());
    responder_ = std::make_shared<Responder>(weak_from_this(), sock_.get_executor(), t_.get());
    if (!reading_ && buf_.size() < pipeline_cap()) start_read_some();  // notices a client that goes away
    auto t = t_;
    t_->post_work([t, req = std::move(req), responder = responder_]() mutable {
      if (t->response_headers) {
        try {
          responder->set_extra_headers(t->response_headers(req));
        } catch (const std::exception& e) {
          spdlog::error("HTTP response headers failed: {}", e.what());
        }
      }
      if (t->precheck) {
        try {
          if (auto early = t->precheck(req)) return responder->send(std::move(*early));
        } catch (const std::exception& e) {
          return responder->send(t->error_body(500, std::string("internal error: ") + e.what()));
        }
      }
      if (auto err = decode_body(req, t->limits)) {
        HttpResponse r = t->error_body(err->status, err->message);
        return responder->send(std::move(r));
      }
      try {
        t->handler(req, responder);
      } catch (const std::exception& e) {
        spdlog::error("HTTP handler failed: {}", e.what());
        responder->send(t->error_body(500, std::string("internal error: ") + sanitize_utf8(e.what())));
      } catch (...) {
        responder->send(t->error_body(500, "internal error"));
      }
    });
  }

  void queue(std::string bytes, bool complete) {
    pending_ += bytes;
    if (complete) complete_ = true;
    if (!writing_) do_write();
  }

  void do_write() {
    if (state_ == kClosed) return;
    writing_ = true;
    current_write_ = std::move(pending_);
    pending_.clear();
    arm_until(Clock::now() + seconds(t_->limits.write_timeout_s));
    net::async_write(sock_, net::buffer(current_write_),
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->writing_ = false;
                       if (self->state_ == kClosed) return;
                       if (ec) return self->close();
                       if (!self->pending_.empty()) return self->do_write();
                       self->disarm();
                       if (self->complete_) self->on_response_done();
                     });
  }

  // Called from a write's completion handler, which holds a reference: dropping hold_ is safe.
  void on_response_done() {
    responder_.reset();  // complete: a later disconnect is no longer this request's concern
    hold_.reset();
    if (!keep_alive_ || t_->shutting_down.load()) return lingering_close();
    do_idle(Clock::now() + seconds(t_->limits.keep_alive_timeout_s));
  }

  // Half-closes, then drains what the client still sends for up to a second, so that the client reads the
  // last response instead of a reset.
  void lingering_close() {
    set_state(kClosing);
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    arm_until(Clock::now() + std::chrono::seconds(1));
    buf_.consume(buf_.size());
    if (!reading_) start_read_some();
  }

  std::shared_ptr<HttpTransport::Impl> t_;
  tcp::socket sock_;
  net::steady_timer timer_;
  uint64_t timer_gen_ = 0;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  State state_ = kIdle;
  std::atomic<int> state_atomic_{kIdle};
  std::atomic<int64_t> since_ns_{0};
  Clock::time_point request_start_;
  bool reading_ = false, writing_ = false, timed_out_ = false, resume_header_ = false;
  bool keep_alive_ = true, response_started_ = false, complete_ = false, streaming_ = false;
  bool head_request_ = false;
  std::string pending_, current_write_;
  std::shared_ptr<std::string> continue_;
  std::shared_ptr<Responder> responder_;
  // Keeps the session alive from dispatch until the response is written or the connection closes.
  std::shared_ptr<Session> hold_;
};

void Responder::send(HttpResponse response) {
  for (const auto& h : extra_) response.headers.push_back(h);
  net::post(ex_, [w = session_, r = std::move(response)]() mutable {
    if (auto s = w.lock()) s->queue_response(std::move(r));
  });
}
void Responder::start_stream(int status, std::string content_type,
                             std::vector<std::pair<std::string, std::string>> headers) {
  for (const auto& h : extra_) headers.push_back(h);
  net::post(ex_, [w = session_, status, ct = std::move(content_type), h = std::move(headers)] {
    if (auto s = w.lock()) s->queue_stream_start(status, ct, h);
  });
}
void Responder::write(std::string data) {
  if (data.empty()) return;
  net::post(ex_, [w = session_, d = std::move(data)] {
    if (auto s = w.lock()) s->queue_chunk(d);
  });
}
void Responder::end() {
  net::post(ex_, [w = session_] {
    if (auto s = w.lock()) s->queue_stream_end();
  });
}

// Picks the connection to close when the limit is reached: the longest idle one, else the one that has
// been sending its request headers the longest. Running requests are never shed.
bool HttpTransport::Impl::shed_one() {
  std::shared_ptr<Session> victim;
  int best_state = 99;
  int64_t best_since = 0;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& w : sessions) {
    auto s = w.lock();
    if (!s) continue;
    int st = s->state();
    if (st != Session::kIdle && st != Session::kHeader && st != Session::kClosing) continue;
    int rank = st == Session::kClosing ? -1 : st;
    if (!victim || rank < best_state || (rank == best_state && s->since() < best_since)) {
      victim = s;
      best_state = rank;
      best_since = s->since();
    }
  }
  if (!victim) return false;
  victim->request_close();
  return true;
}

void HttpTransport::Impl::close_all(bool only_unbusy) {
  std::vector<std::shared_ptr<Session>> all;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& w : sessions)
      if (auto s = w.lock()) all.push_back(std::move(s));
  }
  for (auto& s : all) {
    int st = s->state();
    if (!only_unbusy || st == Session::kIdle || st == Session::kHeader || st == Session::kBody ||
        st == Session::kClosing)
      s->request_close();
  }
}

void HttpTransport::Impl::do_accept() {
  acceptor.async_accept(net::make_strand(ioc), [self = shared_from_this()](beast::error_code ec,
                                                                           tcp::socket socket) {
    if (self->shutting_down.load() || !self->acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors: shed an idle connection and try again shortly.
      if (ec == net::error::no_descriptors) self->shed_one();
      self->retry_timer.expires_after(std::chrono::milliseconds(ec == net::error::no_descriptors ? 50 : 1));
      self->retry_timer.async_wait([self](beast::error_code) { self->do_accept(); });
      return;
    }
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto session = std::make_shared<Session>(self, std::move(socket));
    bool over = self->num_sessions.load() >= self->limits.max_connections;
    if (over && !self->shed_one()) {
      net::post(session->executor(), [session] { session->reject(); });
    } else {
      {
        std::lock_guard<std::mutex> lock(self->mu);
        session->reg_it = self->sessions.insert(self->sessions.end(), session);
        session->registered = true;
        self->num_sessions.fetch_add(1);
      }
      net::post(session->executor(), [session] { session->start(); });
    }
    self->do_accept();
  });
}

HttpTransport::HttpTransport(HttpLimits limits, HttpHandler handler, HttpErrorBody error_body,
                             size_t num_io_threads, size_t num_worker_threads)
    : impl_(std::make_shared<Impl>(limits, std::move(handler), std::move(error_body), num_io_threads,
                                   num_worker_threads)) {
  // Each connection is a descriptor: raise the soft limit to the hard one, and keep the connection limit
  // below it (with room for model files, adapters and logs).
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
      getrlimit(RLIMIT_NOFILE, &rl);
    }
    int64_t room = static_cast<int64_t>(rl.rlim_cur) - 256;
    if (room > 0 && impl_->limits.max_connections > room) {
      spdlog::warn("--max-connections {} is above what the descriptor limit allows; using {}",
                   impl_->limits.max_connections, room);
      impl_->limits.max_connections = room;
    }
  }
}

HttpTransport::~HttpTransport() {
  impl_->work.reset();
  impl_->ioc.stop();
  impl_->workers.stop();
  impl_->workers.join();
}

int HttpTransport::bind(const std::string& host, int port) {
  beast::error_code ec;
  // "" is every interface (vLLM binds (host or "", port)); a name other than an address is resolved.
  auto address = net::ip::make_address(host.empty()          ? "0.0.0.0"
                                       : host == "localhost" ? "127.0.0.1"
                                                             : host,
                                       ec);
  if (ec) {
    tcp::resolver resolver(impl_->ioc);
    auto found = resolver.resolve(host, std::to_string(port), ec);
    if (ec || found.empty()) fail("--host '{}' is neither an IP address nor a name that resolves", host);
    address = found.begin()->endpoint().address();
  }
  tcp::endpoint ep(address, static_cast<unsigned short>(port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(SOMAXCONN, ec);
  if (ec) fail("cannot listen on {}:{}: {}", host, port, ec.message());
  return a.local_endpoint().port();
}

void HttpTransport::run() {
  impl_->do_accept();
  std::vector<std::thread> threads;
  for (size_t i = 1; i < impl_->num_io_threads; ++i) threads.emplace_back([this] { impl_->ioc.run(); });
  impl_->ioc.run();
  for (auto& t : threads) t.join();
}

void HttpTransport::begin_shutdown() {
  if (impl_->shutting_down.exchange(true)) return;
  net::post(impl_->ioc, [impl = impl_] {
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->retry_timer.cancel();
    impl->close_all(true);
  });
}

void HttpTransport::stop(std::chrono::milliseconds drain) {
  begin_shutdown();
  net::post(impl_->ioc, [impl = impl_, drain] {
    impl->stop_timer.expires_after(drain);
    impl->stop_timer.async_wait([impl](beast::error_code) {
      impl->close_all(false);
      impl->work.reset();
      // Let the closes run, then leave run().
      impl->stop_timer.expires_after(std::chrono::milliseconds(50));
      impl->stop_timer.async_wait([impl](beast::error_code) { impl->ioc.stop(); });
    });
  });
}

void HttpTransport::set_response_headers(HttpResponseHeaders fn) {
  impl_->response_headers = std::move(fn);
}

void HttpTransport::set_precheck(HttpPrecheck precheck) {
  impl_->precheck = std::move(precheck);
}

void HttpTransport::post_work(std::function<void()> fn) {
  impl_->post_work(std::move(fn));
}

int64_t HttpTransport::num_connections() const {
  return impl_->num_sessions.load();
}

}  // namespace polylora::server
