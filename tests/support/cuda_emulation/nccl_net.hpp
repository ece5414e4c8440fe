#pragma once
// The emulated NCCL between processes of one machine (ranks under mpirun): a communicator made by
// ncclCommInitRank connects its ranks with Unix-domain stream sockets in Linux's abstract
// namespace, named after the unique id and the rank. What the rank-to-rank operations do, on the
// stream they were issued to:
//   send        writes the bytes to the peer, then waits until the peer's receive has taken them
//               (NCCL's rule that the validator checks schedules against: a send completes only
//               with its receive, so a send before a receive that its peer issues after its own
//               send never completes)
//   receive     waits for the peer's next message (messages between two ranks keep their order),
//               checks its size, copies it and acknowledges it; the receives of one group take
//               their messages in the order they arrive (NCCL runs a group's operations
//               together, so none waits behind another's)
//   all-reduce  (sum) every rank sends its array to every other, then adds all of them in rank
//               order, so that every rank gets the same bits
//   abort       ncclCommAbort: closes the connections without a goodbye and ends this rank's
//               waits; the peers see it as a lost rank
// A peer whose connection closes without ncclCommDestroy's goodbye (abort, or a process that
// died) is lost: waits for it end, and ncclCommGetAsyncError then says ncclRemoteError. A wait
// that ends without its data leaves the destination as it was (new device memory is NaN).
// Initialization is collective, as NCCL's: ncclCommInitRank returns once every rank has connected
// (ncclSystemError after `connect_timeout`).

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace gpipe::test::cuda_emulation {

class RankNet {
 public:
  static constexpr std::chrono::seconds connect_timeout{60};

  // Binds this rank's socket, connects to every other rank's and waits until every other rank has
  // connected to this one. ok() says whether that worked within connect_timeout.
  RankNet(const std::string& token, int rank, int ranks)
      : token_(token), rank_(rank), ranks_(ranks), peers_(static_cast<std::size_t>(ranks)) {
    listener_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address = address_of(rank_);
    if (listener_ < 0 || ::bind(listener_, as_sockaddr(address), sizeof address) != 0 ||
        ::listen(listener_, ranks_) != 0) {
      std::perror("nccl emulator: cannot listen");
      return;
    }
    acceptor_ = std::thread([this] { accept_peers(); });
    const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
    for (int peer = 0; peer < ranks_; ++peer) {
      if (peer == rank_) continue;
      if (!connect_to(peer, deadline)) return;
    }
    std::unique_lock lock(mutex_);
    connected_ = changed_.wait_until(lock, deadline, [this] { return accepted_ == ranks_ - 1; });
  }
  RankNet(const RankNet&) = delete;
  RankNet& operator=(const RankNet&) = delete;
  ~RankNet() { shut(/*goodbye=*/true); }

  bool ok() const { return connected_; }
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }

  // ncclCommGetAsyncError: ncclRemoteError once a peer is lost or a wait failed.
  bool failed() const { return failed_.load(); }

  // Writes `bytes` to `peer` (a message it receives in order); false if it cannot be written.
  bool post(int peer, std::uint32_t kind, const void* data, std::size_t bytes) {
    Peer& p = peers_[static_cast<std::size_t>(peer)];
    std::lock_guard lock(p.write_mutex);
    if (p.out < 0) return false;
    const Header header{kind, 0, bytes};
    return write_all(p.out, &header, sizeof header) && write_all(p.out, data, bytes);
  }
  // Waits for the acknowledgement of the oldest unacknowledged message to `peer`.
  bool wait_ack(int peer) {
    Peer& p = peers_[static_cast<std::size_t>(peer)];
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return p.acks > 0 || p.gone || stopping_; });
    if (p.acks == 0) return fail();
    --p.acks;
    return true;
  }
  // Waits for `peer`'s next message of `kind`, copies it to `data` (which must hold exactly
  // `bytes`) and, for a data message, acknowledges it.
  bool receive(int peer, std::uint32_t kind, void* data, std::size_t bytes) {
    for (;;) {
      const Progress p = try_receive(peer, kind, data, bytes, /*wait=*/true);
      if (p != Progress::not_yet) return p == Progress::done;
    }
  }
  enum class Progress { done, not_yet, failed };
  // receive without waiting when `wait` is false: not_yet while `peer`'s message has not arrived.
  // A group's receives use it to progress in the order their messages arrive, as NCCL runs a
  // group's operations together.
  Progress try_receive(int peer, std::uint32_t kind, void* data, std::size_t bytes, bool wait) {
    Peer& p = peers_[static_cast<std::size_t>(peer)];
    std::vector<char> message;
    {
      std::unique_lock lock(mutex_);
      std::deque<std::vector<char>>& box = kind == data_message ? p.inbox : p.collective_inbox;
      if (wait) changed_.wait(lock, [&] { return !box.empty() || p.gone || stopping_; });
      if (box.empty()) {
        if (!p.gone && !stopping_) return Progress::not_yet;
        fail();
        return Progress::failed;
      }
      message = std::move(box.front());
      box.pop_front();
    }
    if (message.size() != bytes) {
      std::fprintf(stderr, "nccl emulator: rank %d received %zu bytes from rank %d, expected %zu\n",
                   rank_, message.size(), peer, bytes);
      fail();
      return Progress::failed;
    }
    if (bytes > 0) std::memcpy(data, message.data(), bytes);
    if (kind == data_message && !post(peer, ack_message, nullptr, 0)) {
      fail();
      return Progress::failed;
    }
    return Progress::done;
  }
  // out[i] = sum over the ranks of their in[i], added in rank order.
  bool allreduce_sum(const float* in, float* out, std::size_t count) {
    const std::size_t bytes = count * sizeof(float);
    for (int peer = 0; peer < ranks_; ++peer)
      if (peer != rank_ && !post(peer, collective_message, in, bytes)) return fail();
    std::vector<float> mine(in, in + count), theirs(count), sum(count, 0.0f);
    for (int r = 0; r < ranks_; ++r) {
      const float* values = mine.data();
      if (r != rank_) {
        if (!receive(r, collective_message, theirs.data(), bytes)) return false;
        values = theirs.data();
      }
      for (std::size_t i = 0; i < count; ++i) sum[i] = r == 0 ? values[i] : sum[i] + values[i];
    }
    if (bytes > 0) std::memcpy(out, sum.data(), bytes);
    return true;
  }

  // ncclCommAbort (goodbye = false) or ncclCommDestroy (true): ends every wait, closes the
  // connections and joins the readers.
  void shut(bool goodbye) {
    {
      std::lock_guard lock(mutex_);
      if (shut_) return;
      shut_ = stopping_ = true;
    }
    changed_.notify_all();
    for (Peer& p : peers_) {
      if (p.out < 0) continue;
      if (goodbye) post(static_cast<int>(&p - peers_.data()), bye_message, nullptr, 0);
      ::shutdown(p.out, SHUT_RDWR);
    }
    if (listener_ >= 0) ::shutdown(listener_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
    for (Peer& p : peers_)
      if (p.in >= 0) ::shutdown(p.in, SHUT_RDWR);
    for (std::thread& t : readers_) t.join();
    for (Peer& p : peers_) {
      {
        // a stream's operation may still post (it holds this object): it then finds no socket,
        // never a descriptor number that something else reuses
        std::lock_guard lock(p.write_mutex);
        if (p.out >= 0) ::close(p.out);
        p.out = -1;
      }
      if (p.in >= 0) ::close(p.in);
    }
    if (listener_ >= 0) ::close(listener_);
  }

  static constexpr std::uint32_t hello_message = 1, data_message = 2, ack_message = 3,
                                 collective_message = 4, bye_message = 5;

 private:
  struct Header {
    std::uint32_t kind, unused;
    std::uint64_t bytes;
  };
  struct Peer {
    int out = -1, in = -1;  // the connection this rank made to the peer, and the peer's to it
    std::mutex write_mutex;
    std::deque<std::vector<char>> inbox, collective_inbox;
    std::size_t acks = 0;  // acknowledgements received, not yet waited for
    bool gone = false;     // its connection closed: nothing more comes from it
    bool lost = false;     // ... without a goodbye
  };

  sockaddr_un address_of(int rank) const {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const std::string name = "gpipe-nccl-emulator-" + token_ + "-" + std::to_string(rank);
    std::memcpy(address.sun_path + 1, name.data(),
                std::min(name.size(), sizeof address.sun_path - 2));  // [0] = 0: abstract
    return address;
  }
  static sockaddr* as_sockaddr(sockaddr_un& a) { return reinterpret_cast<sockaddr*>(&a); }

  static bool write_all(int fd, const void* data, std::size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      p += n;
      bytes -= static_cast<std::size_t>(n);
    }
    return true;
  }
  static bool read_all(int fd, void* data, std::size_t bytes) {
    char* p = static_cast<char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::recv(fd, p, bytes, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      p += n;
      bytes -= static_cast<std::size_t>(n);
    }
    return true;
  }

  bool connect_to(int peer, std::chrono::steady_clock::time_point deadline) {
    sockaddr_un address = address_of(peer);
    for (;;) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd >= 0 && ::connect(fd, as_sockaddr(address), sizeof address) == 0) {
        peers_[static_cast<std::size_t>(peer)].out = fd;
        const std::uint64_t me = static_cast<std::uint64_t>(rank_);
        return post(peer, hello_message, &me, sizeof me);
      }
      if (fd >= 0) ::close(fd);
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(stderr, "nccl emulator: rank %d cannot reach rank %d\n", rank_, peer);
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  void accept_peers() {
    for (int accepted = 0; accepted < ranks_ - 1; ++accepted) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      Header header{};
      std::uint64_t peer = 0;
      if (!read_all(fd, &header, sizeof header) || header.kind != hello_message ||
          !read_all(fd, &peer, sizeof peer) || peer >= static_cast<std::uint64_t>(ranks_)) {
        ::close(fd);
        return;
      }
      std::lock_guard lock(mutex_);
      if (shut_) {
        ::close(fd);
        return;
      }
      peers_[peer].in = fd;
      readers_.emplace_back([this, peer = static_cast<int>(peer)] { read_from(peer); });
      ++accepted_;
      changed_.notify_all();
    }
  }

  void read_from(int peer) {
    Peer& p = peers_[static_cast<std::size_t>(peer)];
    for (;;) {
      Header header{};
      bool whole = read_all(p.in, &header, sizeof header);
      std::vector<char> payload;
      if (whole && header.bytes > 0) {
        payload.resize(header.bytes);
        whole = read_all(p.in, payload.data(), payload.size());
      }
      std::lock_guard lock(mutex_);
      if (!whole || header.kind == bye_message) {
        p.gone = true;
        if (!whole && !shut_) {
          p.lost = true;
          failed_ = true;
          std::fprintf(stderr, "nccl emulator: rank %d lost rank %d (communicator %s)\n", rank_,
                       peer, token_.c_str());
        }
        changed_.notify_all();
        return;
      }
      if (header.kind == data_message) p.inbox.push_back(std::move(payload));
      if (header.kind == collective_message) p.collective_inbox.push_back(std::move(payload));
      if (header.kind == ack_message) ++p.acks;
      changed_.notify_all();
    }
  }

  bool fail() {
    failed_ = true;
    return false;
  }

  std::string token_;
  int rank_, ranks_;
  int listener_ = -1;
  std::vector<Peer> peers_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int accepted_ = 0;
  bool connected_ = false, shut_ = false, stopping_ = false;
  std::atomic<bool> failed_{false};
  std::thread acceptor_;
  std::vector<std::thread> readers_;
};

}  // namespace gpipe::test::cuda_emulation
