// tokenizer/jinja_value.h: the dynamic value of the Jinja renderer, with Python semantics.
// Owns: Value (undefined, None, bool, int, float, str, list, tuple, dict, namespace, callable), Python
// truthiness, equality and ordering, str()/repr() printing and json.dumps-compatible serialisation.
// Must not: parse templates or know about chat messages; list and dict storage is shared by reference
// (like Python objects), so a Value is cheap to copy and mutation through a namespace is visible to all.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"

namespace polylora::jinja {

// raise_exception(msg) in a template: what() is exactly the template's message.
class TemplateRaisedError : public Error {
 public:
  explicit TemplateRaisedError(const std::string& message) : Error(message) {}
};

// Deepest nesting of lists/dicts a render may build (deeper values would overflow the stack when
// printed or destroyed).
inline constexpr int kMaxValueDepth = 512;
// Longest text repr() or to_json() will build.
inline constexpr size_t kMaxPrintedBytes = size_t{64} << 20;

enum class ValueKind {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kNamespace,
  kFunction
};

class Value;
class Renderer;
using ValueList = std::vector<Value>;

// Arguments of a call: positional then keyword, in source order.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

// A callable value: a macro, a global function (range, namespace, ...) or a bound method.
struct Function {
  std::string name;
  std::function<Value(Renderer&, CallArgs&)> call;
};

struct ValueDict;

class Value {
 public:
  Value() = default;  // undefined
  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  static Value list(ValueList items = {});
  static Value tuple(ValueList items);
  static Value dict();
  static Value name_space();
  static Value function(std::string name, std::function<Value(Renderer&, CallArgs&)> call);

  ValueKind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == ValueKind::kUndefined; }
  bool is_none() const { return kind_ == ValueKind::kNone; }
  bool is_string() const { return kind_ == ValueKind::kString; }
  bool is_int() const {
    return kind_ == ValueKind::kInt || kind_ == ValueKind::kBool;
  }  // Python: bool is int
  bool is_number() const { return is_int() || kind_ == ValueKind::kFloat; }
  bool is_sequence() const { return kind_ == ValueKind::kList || kind_ == ValueKind::kTuple; }
  bool is_mapping() const { return kind_ == ValueKind::kDict; }
  bool has_entries() const { return kind_ == ValueKind::kDict || kind_ == ValueKind::kNamespace; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const { return kind_ == ValueKind::kBool ? (bool_ ? 1 : 0) : int_; }
  double as_float() const { return kind_ == ValueKind::kFloat ? float_ : static_cast<double>(as_int()); }
  const std::string& as_string() const {
    return str_ ? *str_ : empty_string();
  }  // the string, or the name of an undefined
  ValueList& items() const { return *list_; }
  ValueDict& entries() const { return *dict_; }
  const Function& as_function() const { return *fn_; }

  bool truthy() const;
  // Python len(); nullopt where the value has no length.
  std::optional<int64_t> length() const;
  // Python str() (what {{ }} prints; undefined prints nothing) and repr().
  std::string str() const;
  std::string repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=...); indent < 0 means None.
  std::string to_json(int indent = -1, bool sort_keys = false) const;
  // The elements a for loop visits: list/tuple items, dict keys, string characters; undefined is empty.
  ValueList iterate() const;
  // Attribute or key of a dict/namespace; undefined when missing.
  Value get(std::string_view key) const;
  const char* type_name() const;
  // Nesting depth: 0 for scalars, 1 + the deepest element for containers.
  int depth() const;

 private:
  std::string repr_at(int level) const;

  ValueKind kind_ = ValueKind::kUndefined;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  int depth_ = 0;                           // lists and tuples (immutable once built)
  std::shared_ptr<const std::string> str_;  // shared: copying a Value never copies the text
  static const std::string& empty_string();
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Function> fn_;
};

// An insertion-ordered dict (Python 3.7+ semantics) keyed by any hashable value.
struct ValueDict {
  std::vector<std::pair<Value, Value>> entries;
  int depth = 1;  // 1 + the deepest value; kept by set() (callers filling entries directly must update it)
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(const Value& key, Value value);
};

// Python ==, and <, <=, >, >= (nullopt when the operands cannot be ordered).
bool values_equal(const Value& a, const Value& b);
std::optional<int> compare_values(const Value& a, const Value& b);

std::string py_float_repr(double d);
std::string py_string_repr(std::string_view s);
std::string json_string(std::string_view s);

// UTF-8 helpers: number of code points, and byte offsets of each code point (plus the end).
int64_t utf8_length(std::string_view s);
std::vector<size_t> utf8_offsets(std::string_view s);

}  // namespace polylora::jinja
