// server/api_error.h: errors as the OpenAI API reports them: the HTTP status of a polylora::Error or of any
// exception, and the error object {"error": {"message", "type", "param", "code"}}. Shared by the routes and
// by generations in flight. Must not: touch sockets or the engine.
#pragma once

#include <exception>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"

namespace polylora::server {

// 400 (invalid input), 404 (unknown model or adapter), 503 (overloaded or shutting down).
int status_of(const Error& e);
// The status and message of an exception: status_of() for polylora::Error, 500 ("internal error: ...")
// for anything else.
int status_of_exception(std::exception_ptr error, std::string& message);
// The OpenAI error object; the message is made valid UTF-8.
nlohmann::ordered_json error_json(int status, const std::string& message);

}  // namespace polylora::server
