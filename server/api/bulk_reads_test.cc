#include "server/api/bulk_reads.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/api/grpc_buffers.h"

namespace capstan::server {
namespace {

std::vector<std::string> Parts(size_t bytes) { return {std::string(bytes, 'x'), "tail"}; }

TEST(GrpcBuffersTest, CopiedPartsAreOneSliceInOrder) {
  grpc::ByteBuffer buffer;
  CopyPartsToBuffer({"head", "", std::string(100, 'k'), "tail"}, &buffer);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 1u);
  std::string flat;
  ASSERT_TRUE(FlattenBuffer(buffer, &flat));
  EXPECT_EQ(flat, "head" + std::string(100, 'k') + "tail");

  CopyPartsToBuffer({"", ""}, &buffer);
  EXPECT_EQ(buffer.Length(), 0u);
}

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

std::vector<std::unique_ptr<mvcc::ByteSink>> Sinks(std::unique_ptr<BulkReads::BlockSink> sink) {
  std::vector<std::unique_ptr<mvcc::ByteSink>> v;
  v.push_back(std::move(sink));
  return v;
}

// A pattern that shows a misplaced or repeated byte at any block boundary.
std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (i * 7 + i / 251) % 26);
  return s;
}

TEST(BulkReadsTest, BlockSinkBytesGoOutInOrderAndTheBlocksComeBack) {
  BulkReads::Options options;
  options.kept_block_bytes = 8 * BulkReads::kBlockBytes;
  BulkReads bulk(options);
  const std::string kvs = Pattern(3 * BulkReads::kBlockBytes + 12345);
  auto sink = bulk.NewSink();
  // Appends of odd sizes, so that some straddle a block boundary.
  for (size_t at = 0; at < kvs.size();) {
    const size_t n = std::min<size_t>(kvs.size() - at, 1 + (at % 70001));
    sink->Append(std::string_view(kvs).substr(at, n));
    at += n;
  }
  EXPECT_EQ(sink->size(), kvs.size());

  grpc::ByteBuffer buffer;
  bulk.Hold("head", Sinks(std::move(sink)), "tail", &buffer);
  EXPECT_EQ(bulk.held_bytes(), kvs.size() + 8);
  EXPECT_EQ(bulk.kept_block_bytes(), 0u);
  std::string flat;
  ASSERT_TRUE(FlattenBuffer(buffer, &flat));
  EXPECT_TRUE(flat == "head" + kvs + "tail") << "the message's bytes differ";

  buffer.Clear();  // gRPC sent it
  EXPECT_EQ(bulk.held_bytes(), 0u);
  EXPECT_EQ(bulk.kept_block_bytes(), 4 * BulkReads::kBlockBytes);

  // The next read takes the kept blocks rather than new ones.
  auto again = bulk.NewSink();
  again->Append(std::string(2 * BulkReads::kBlockBytes, 'y'));
  EXPECT_EQ(bulk.kept_block_bytes(), 2 * BulkReads::kBlockBytes);
  again.reset();  // an error: never sent, its blocks are kept
  EXPECT_EQ(bulk.kept_block_bytes(), 4 * BulkReads::kBlockBytes);
  EXPECT_EQ(bulk.held_bytes(), 0u);
}

TEST(BulkReadsTest, KeptBlocksAreBounded) {
  BulkReads::Options options;
  options.kept_block_bytes = 2 * BulkReads::kBlockBytes;
  BulkReads bulk(options);
  auto sink = bulk.NewSink();
  sink->Append(std::string(5 * BulkReads::kBlockBytes, 'z'));
  grpc::ByteBuffer buffer;
  bulk.Hold("", Sinks(std::move(sink)), "", &buffer);
  EXPECT_EQ(buffer.Length(), 5 * BulkReads::kBlockBytes);
  buffer.Clear();
  EXPECT_EQ(bulk.kept_block_bytes(), 2 * BulkReads::kBlockBytes);
  EXPECT_EQ(bulk.held_bytes(), 0u);
}

TEST(BulkReadsTest, KeptBlocksAreFreedWhenNoBigReadComes) {
  BulkReads::Options options;
  options.keep_idle_blocks = std::chrono::milliseconds(50);
  BulkReads bulk(options);
  auto sink = bulk.NewSink();
  sink->Append(std::string(BulkReads::kBlockBytes + 1, 'w'));
  grpc::ByteBuffer buffer;
  bulk.Hold("h", Sinks(std::move(sink)), "t", &buffer);
  buffer.Clear();
  EXPECT_EQ(bulk.kept_block_bytes(), 2 * BulkReads::kBlockBytes);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (bulk.kept_block_bytes() != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(bulk.kept_block_bytes(), 0u);
}

TEST(BulkReadsTest, BlocksMayOutliveThePool) {
  grpc::ByteBuffer buffer;
  {
    BulkReads bulk(BulkReads::Options{});
    auto sink = bulk.NewSink();
    sink->Append(std::string(BulkReads::kBlockBytes + 10, 'v'));
    bulk.Hold("h", Sinks(std::move(sink)), "t", &buffer);
  }
  EXPECT_EQ(buffer.Length(), BulkReads::kBlockBytes + 12);
  buffer.Clear();
}

TEST(BulkReadsTest, AHelperRunsBeforeQueuedReadsAndOverTheBound) {
  BulkReads::Options options;
  options.threads = 1;
  options.max_held_bytes = 100;
  BulkReads bulk(options);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](std::string what) {
    std::lock_guard<std::mutex> l(mu);
    order.push_back(std::move(what));
  };
  grpc::ByteBuffer held;
  std::promise<void> started;
  bulk.Run([&] {
    bulk.Hold(Parts(1000), &held);  // over the bound until cleared
    started.set_value();
    released.wait();
    record("first");
  });
  started.get_future().wait();  // the one thread is busy from here on
  bulk.Run([&] { record("queued read"); });
  std::promise<void> helped;
  bulk.RunHelper([&] {
    record("helper");
    helped.set_value();
  });
  release.set_value();
  // The helper runs although the budget is over its bound.
  ASSERT_EQ(helped.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  {
    std::lock_guard<std::mutex> l(mu);
    EXPECT_EQ(order, (std::vector<std::string>{"first", "helper"}));
  }
  held.Clear();  // the queued read may start now
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (order.size() == 3 || std::chrono::steady_clock::now() > deadline) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(order, (std::vector<std::string>{"first", "helper", "queued read"}));
}

TEST(BulkReadsTest, SeveralSinksGoOutAsOneMessageInOrder) {
  BulkReads bulk(BulkReads::Options{});
  const std::string a = Pattern(BulkReads::kBlockBytes + 3), b = Pattern(17), c = Pattern(5000);
  std::vector<std::unique_ptr<mvcc::ByteSink>> sinks;
  for (const std::string* s : {&a, &b, &c}) {
    auto sink = bulk.NewSink();
    sink->Append(*s);
    sinks.push_back(std::move(sink));
  }
  sinks.push_back(bulk.NewSink());  // an empty part
  grpc::ByteBuffer buffer;
  bulk.Hold("head", std::move(sinks), "tail", &buffer);
  EXPECT_EQ(bulk.held_bytes(), a.size() + b.size() + c.size() + 8);
  std::string flat;
  ASSERT_TRUE(FlattenBuffer(buffer, &flat));
  EXPECT_TRUE(flat == "head" + a + b + c + "tail");
  buffer.Clear();
  EXPECT_EQ(bulk.held_bytes(), 0u);
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
