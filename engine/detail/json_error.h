// Malformed JSON described in words. nlohmann's parse_error text ("[json.exception.parse_error.101]
// parse error at line 1, column 9: syntax error while parsing object key - unexpected end of
// input; expected string literal") is written for its own developers; a user needs what is wrong
// and where. Callers name the file and the byte offset (parse_error::byte); this says the rest:
// "the text ends before the JSON is complete, inside an object's key (expected a quoted key)".
// Internal to ditto's readers (checkpoint headers, run manifests, pins files, tuning files).
#pragma once
#include <cctype>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace ditto::detail {

inline std::string json_syntax_problem(const nlohmann::json::parse_error& e) {
  const std::string what = e.what();
  // Drop the exception id and nlohmann's "line L, column C: " (the caller gives the byte offset).
  std::size_t at = what.find("parse error");
  at = at == std::string::npos ? std::string::npos : what.find(": ", at);
  std::string body = at == std::string::npos ? what : what.substr(at + 2);
  auto between = [&](const std::string& from, const std::string& to) -> std::string {
    std::size_t a = body.find(from);
    if (a == std::string::npos) return "";
    a += from.size();
    std::size_t b = to.empty() ? std::string::npos : body.find(to, a);
    return body.substr(a, b == std::string::npos ? std::string::npos : b - a);
  };
  const std::string prefix = "syntax error while parsing ";
  if (body.rfind(prefix, 0) != 0) return body;  // not a syntax error (e.g. a BOM or encoding problem)
  std::string context = between(prefix, " - ");
  std::string problem = between(" - ", ";");
  if (problem.empty()) problem = between(" - ", "");
  std::string last = between("last read: '", "'");
  std::string expected = between("; expected ", "");

  auto starts = [&](const char* s) { return problem.rfind(s, 0) == 0; };
  std::string words;
  if (starts("unexpected end of input")) words = "the text ends before the JSON is complete (a truncated file?)";
  else if (starts("invalid literal")) words = "a bare word (JSON knows only true, false and null; text needs double quotes)";
  else if (starts("invalid string: missing closing quote")) words = "a string without its closing quote";
  else if (starts("invalid string: control character")) words = "a raw control character inside a string";
  else if (starts("invalid string: ill-formed UTF-8")) words = "bytes inside a string that are not UTF-8";
  else if (starts("invalid string")) words = "a malformed string escape";
  else if (starts("invalid number")) words = "a malformed number";
  else if (starts("unexpected ")) words = "an " + problem;
  else words = problem;

  if (context == "object key") context = "an object's key";
  else if (context == "object separator" || context == "object") context = "an object";
  else if (context == "array") context = "an array";
  else if (context == "value") context = "a value";
  if (!context.empty()) words += ", inside " + context;

  if (expected == "'[', '{', or a literal") expected = "a value";
  else if (expected == "string literal") expected = "a quoted key";
  else if (expected == "end of input") expected = "nothing more: there is text after the JSON value";
  if (!expected.empty()) words += " (expected " + expected + ")";

  // What the reader saw last, printable and short: binary garbage must not reach a terminal.
  std::string near;
  for (char c : last.substr(last.size() > 24 ? last.size() - 24 : 0))
    near += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  if (!near.empty()) words += "; last read: '" + near + "'";
  return words;
}

}  // namespace ditto::detail
