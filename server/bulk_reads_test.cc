#include "server/bulk_reads.h"

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/grpc_buffers.h"

namespace capstan::server {
namespace {

std::vector<std::string> Parts(size_t bytes) { return {std::string(bytes, 'x'), "tail"}; }

TEST(BulkReadsTest, RunsEveryReadInOrderOnOneThread) {
  BulkReads::Options options;
  options.threads = 1;
  BulkReads bulk(options);
  std::vector<int> order;
  std::promise<void> done;
  for (int i = 0; i < 100; ++i) bulk.Run([&order, i] { order.push_back(i); });
  bulk.Run([&done] { done.set_value(); });
  done.get_future().wait();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(BulkReadsTest, HeldBytesAreCountedUntilTheBufferIsDropped) {
  BulkReads bulk(BulkReads::Options{});
  grpc::ByteBuffer buffer;
  bulk.Hold(Parts(1000), &buffer);
  EXPECT_EQ(bulk.held_bytes(), 1004u);
  EXPECT_EQ(buffer.Length(), 1004u);
  std::string flat;
  ASSERT_TRUE(FlattenBuffer(buffer, &flat));
  EXPECT_EQ(flat, std::string(1000, 'x') + "tail");
  buffer.Clear();
  EXPECT_EQ(bulk.held_bytes(), 0u);
}

TEST(BulkReadsTest, ANewReadWaitsWhileTheBoundIsHeld) {
  BulkReads::Options options;
  options.threads = 1;
  options.max_held_bytes = 1000;
  BulkReads bulk(options);
  grpc::ByteBuffer first;
  std::promise<void> first_built;
  bulk.Run([&] {
    bulk.Hold(Parts(2000), &first);  // one read may always run, even over the bound
    first_built.set_value();
  });
  first_built.get_future().wait();
  std::atomic<bool> second_ran{false};
  bulk.Run([&] { second_ran = true; });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(second_ran) << "a read started while 2004 bytes of 1000 were held";
  first.Clear();  // gRPC sent the response and dropped it
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!second_ran && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(second_ran);
}

TEST(BulkReadsTest, ABufferMayOutliveThePool) {
  grpc::ByteBuffer buffer;
  {
    BulkReads bulk(BulkReads::Options{});
    bulk.Hold(Parts(10), &buffer);
  }
  EXPECT_EQ(buffer.Length(), 14u);
  buffer.Clear();
}

TEST(BulkReadsTest, DestructionRunsQueuedReads) {
  std::atomic<int> ran{0};
  {
    BulkReads::Options options;
    options.threads = 2;
    BulkReads bulk(options);
    for (int i = 0; i < 50; ++i) bulk.Run([&ran] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace capstan::server
