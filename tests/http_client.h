// A small HTTP/1.1 client over a plain socket for tests of the client URLs'
// HTTP side: whole answers (Content-Length or chunked) and streamed ones,
// read line by line as etcd's gateway streams them.

#ifndef CAPSTAN_TESTS_HTTP_CLIENT_H_
#define CAPSTAN_TESTS_HTTP_CLIENT_H_

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace capstan::testing {

struct HttpAnswer {
  int status = 0;  // 0: no answer (connection failed or timed out)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// One connection to 127.0.0.1:port. Not thread-safe.
class HttpClient {
 public:
  explicit HttpClient(int port);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  bool connected() const { return fd_ >= 0; }

  // Sends a request (Content-Length body; Host 127.0.0.1 unless given).
  bool Send(const std::string& method, const std::string& path, const std::string& body,
            const std::vector<std::pair<std::string, std::string>>& headers = {});
  // Sends bytes as they are (a malformed request, say).
  bool SendRaw(const std::string& bytes);
  // Reads the status line and headers of the answer.
  bool ReadHead(HttpAnswer* answer, std::chrono::milliseconds timeout);
  // Reads the rest of a whole answer into answer->body.
  bool ReadBody(HttpAnswer* answer, std::chrono::milliseconds timeout);
  // Reads a chunked body up to n complete lines (or its end, or the
  // timeout); appends them to *lines without their newlines. False if the
  // body ended or the time ran out first.
  bool ReadLines(size_t n, std::vector<std::string>* lines, std::chrono::milliseconds timeout);

  // Send, ReadHead and ReadBody.
  HttpAnswer Request(const std::string& method, const std::string& path, const std::string& body,
                     const std::vector<std::pair<std::string, std::string>>& headers = {},
                     std::chrono::milliseconds timeout = std::chrono::seconds(15));

  // Closes the connection (a streaming answer's server side sees it).
  void Close();

 private:
  bool Fill(std::chrono::steady_clock::time_point deadline);
  bool Line(std::string* line, std::chrono::steady_clock::time_point deadline);
  bool Exactly(size_t n, std::string* out, std::chrono::steady_clock::time_point deadline);
  // The next chunk of a chunked body; false at its end.
  bool Chunk(std::string* out, std::chrono::steady_clock::time_point deadline);

  int fd_ = -1;
  std::string in_;
  bool chunked_ = false;
  bool head_ = false;  // the request was HEAD: no body follows
  bool ended_ = false;
  std::string partial_;  // a line begun, not yet ended
  long content_length_ = -1;
};

// One whole request on a new connection.
HttpAnswer HttpRequestTo(int port, const std::string& method, const std::string& path,
                         const std::string& body = "",
                         const std::vector<std::pair<std::string, std::string>>& headers = {});

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_HTTP_CLIENT_H_
