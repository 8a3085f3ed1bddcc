#include "server/observability/logging.h"
#include "util/go_text.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/basic_file_sink.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace capstan::server {
namespace {

// %* : the message, escaped for a JSON string.
class EscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    std::string escaped = gotext::JsonEscape(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<EscapedMessage>();
  }
};

// %C : the caller, "dir/file.cc:line" relative to the checkout. The
// compiler maps the checkout's absolute path away; a path relative to the
// build directory (ccache with CCACHE_BASEDIR compiles with those) loses
// its leading "../" here.
class Caller final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    if (msg.source.empty()) return;
    std::string_view file = msg.source.filename;
    while (file.substr(0, 3) == "../") file.remove_prefix(3);
    std::string text(file);
    text += ':';
    text += std::to_string(msg.source.line);
    dest.append(text.data(), text.data() + text.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<Caller>();
  }
};

// %L : etcd's (zap's) level names.
class ZapLevel final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    std::string_view name;
    switch (msg.level) {
      case spdlog::level::trace:
      case spdlog::level::debug: name = "debug"; break;
      case spdlog::level::info: name = "info"; break;
      case spdlog::level::warn: name = "warn"; break;
      case spdlog::level::err: name = "error"; break;
      default: name = "fatal"; break;
    }
    dest.append(name.data(), name.data() + name.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<ZapLevel>();
  }
};

spdlog::level::level_enum ToSpdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    default: return spdlog::level::critical;
  }
}

}  // namespace


namespace {

// Protobuf's own messages, in the same log. Its complaint about a string
// field that is not UTF-8 comes from a client's bytes, which etcd takes
// without a word (server/api/go_unmarshal.h): one per such request, so debug.
void ProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                 const std::string& message) {
  spdlog::level::level_enum to = spdlog::level::err;
  if (message.find("invalid UTF-8") != std::string::npos) {
    to = spdlog::level::debug;
  } else if (level < google::protobuf::LOGLEVEL_WARNING) {
    to = spdlog::level::info;
  } else if (level == google::protobuf::LOGLEVEL_WARNING) {
    to = spdlog::level::warn;
  }
  spdlog::default_logger_raw()->log(spdlog::source_loc{filename, line, ""}, to, "protobuf: {}",
                                    message);
}

}  // namespace

absl::Status InitLogging(LogLevel level, const std::vector<std::string>& outputs) {
  std::vector<spdlog::sink_ptr> sinks;
  for (const auto& out : outputs) {
    if (out == "default" || out == "stderr") {
      sinks.push_back(std::make_shared<spdlog::sinks::stderr_sink_mt>());
    } else if (out == "stdout") {
      sinks.push_back(std::make_shared<spdlog::sinks::stdout_sink_mt>());
    } else {
      try {
        sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(out));
      } catch (const spdlog::spdlog_ex& e) {
        return absl::InvalidArgumentError(absl::StrCat("cannot open log output ", out, ": ", e.what()));
      }
    }
  }
  auto logger = std::make_shared<spdlog::logger>("capstan", sinks.begin(), sinks.end());
  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  formatter->add_flag<ZapLevel>('L').add_flag<EscapedMessage>('*').add_flag<Caller>('C').set_pattern(
      R"({"level":"%L","ts":"%Y-%m-%dT%H:%M:%S.%fZ","caller":"%C","msg":"%*"})");
  logger->set_formatter(std::move(formatter));
  logger->set_level(ToSpdlog(level));
  // Every line reaches its output when written, as with etcd's zap (which
  // writes unbuffered): a log file can be followed, and nothing is lost when
  // the process is killed. Lines are few (none per request above debug).
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  google::protobuf::SetLogHandler(&ProtobufLog);
  return absl::OkStatus();
}

}  // namespace capstan::server
