// server/api_error.cc: statuses and error objects of the OpenAI API (see the header).
#include "server/api_error.h"

#include "common/utf8.h"

namespace polylora::server {

namespace {

const char* error_type(int status) {
  switch (status) {
    case 400:
    case 408:
    case 413:
    case 415:
    case 431:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 404:
      return "NotFoundError";
    case 405:
      return "MethodNotAllowedError";
    case 501:
      return "NotImplementedError";
    case 503:
      return "ServiceUnavailableError";
    default:
      return "InternalServerError";
  }
}

}  // namespace

int status_of(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kInvalid:
      return 400;
    case ErrorKind::kNotFound:
      return 404;
    case ErrorKind::kOverloaded:
      return 503;
  }
  return 500;
}

int status_of_exception(std::exception_ptr error, std::string& message) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    message = e.what();
    return status_of(e);
  } catch (const std::exception& e) {
    message = std::string("internal error: ") + e.what();
  } catch (...) {
    message = "internal error";
  }
  return 500;
}

nlohmann::ordered_json error_json(int status, const std::string& message) {
  return {{"error",
           {{"message", sanitize_utf8(message)},
            {"type", error_type(status)},
            {"param", nullptr},
            {"code", status}}}};
}

}  // namespace polylora::server
