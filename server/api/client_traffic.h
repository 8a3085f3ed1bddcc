// etcd's etcd_network_client_grpc_received_bytes_total and
// etcd_network_client_grpc_sent_bytes_total: the bytes of every message
// received from and sent to gRPC clients, counted as etcd's codec counts them
// (each message's protobuf encoding, without gRPC's framing or headers).
// Process-wide, as etcd's counters are.
//
// Counted where the services see a message's bytes: requests as they are
// decoded (Decoded<Request>, and the services that read raw bytes), answers
// as they are encoded (Encoded<Response> for the decoding services' unary
// methods, and the services that write raw bytes or stream). The
// grpc.health.v1 service, which gRPC's generated code serves, is not counted.

#ifndef CAPSTAN_SERVER_API_CLIENT_TRAFFIC_H_
#define CAPSTAN_SERVER_API_CLIENT_TRAFFIC_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace capstan::server {

class ClientTraffic {
 public:
  static void Received(size_t bytes) { received_.fetch_add(bytes, std::memory_order_relaxed); }
  static void Sent(size_t bytes) { sent_.fetch_add(bytes, std::memory_order_relaxed); }
  static uint64_t received() { return received_.load(std::memory_order_relaxed); }
  static uint64_t sent() { return sent_.load(std::memory_order_relaxed); }

 private:
  static inline std::atomic<uint64_t> received_{0};
  static inline std::atomic<uint64_t> sent_{0};
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_CLIENT_TRAFFIC_H_
