#include "daemon/transport/data_auth.h"

#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

namespace mlfabric::transport {
namespace {

struct SocketPair {
  SocketPair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0); }
  ~SocketPair() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int fds[2];
};

struct Handshake {
  absl::StatusOr<SessionAuth> initiator;
  absl::StatusOr<SessionAuth> acceptor;
};

Handshake Run(const DataKeys& initiator_keys, const DataKeys& acceptor_keys) {
  SocketPair pair;
  auto acceptor = std::async(std::launch::async, [&] {
    return AcceptorHandshake(pair.fds[1], acceptor_keys, "10.0.0.2:4000");
  });
  Handshake result{InitiatorHandshake(pair.fds[0], initiator_keys, "w1", "s1 at 10.0.0.1:7000"),
                   absl::UnknownError("")};
  // A caller closes the connection when its handshake fails.
  if (!result.initiator.ok()) ::shutdown(pair.fds[0], SHUT_RDWR);
  result.acceptor = acceptor.get();
  return result;
}

bool Contains(const absl::Status& status, const std::string& text) {
  return std::string(status.message()).find(text) != std::string::npos;
}

TEST_CASE("both ends holding the cluster key authenticate each other") {
  DataKeys keys;
  keys.SetClusterKey("cluster key");
  keys.SetJobKey(7, "job 7 key");
  Handshake h = Run(keys, keys);
  REQUIRE(h.initiator.ok());
  REQUIRE(h.acceptor.ok());
  CHECK(h.acceptor->initiator == "w1");
  CHECK(h.initiator->nonces == h.acceptor->nonces);
  CHECK(h.initiator->nonces.size() == 64);
  CHECK_FALSE(h.acceptor->Allows(7));

  // A job proof made with the job's key is taken, once per session.
  auto proof = JobProof(*h.initiator, keys, 7);
  REQUIRE(proof.ok());
  REQUIRE(AcceptJobProof(*h.acceptor, keys, 7, *proof).ok());
  CHECK(h.acceptor->Allows(7));
  CHECK_FALSE(h.acceptor->Allows(8));

  // Replayed on another session (other nonces), the same proof is refused.
  Handshake again = Run(keys, keys);
  REQUIRE(again.acceptor.ok());
  absl::Status replayed = AcceptJobProof(*again.acceptor, keys, 7, *proof);
  CHECK(replayed.code() == absl::StatusCode::kPermissionDenied);
  CHECK(Contains(replayed, "job 7: wrong proof from 'w1'"));
}

TEST_CASE("a daemon outside a job cannot prove it is in the job") {
  DataKeys member;
  member.SetClusterKey("cluster key");
  member.SetJobKey(7, "job 7 key");
  DataKeys outsider;
  outsider.SetClusterKey("cluster key");
  outsider.SetJobKey(8, "job 8 key");
  Handshake h = Run(outsider, member);
  REQUIRE(h.initiator.ok());
  REQUIRE(h.acceptor.ok());
  auto no_key = JobProof(*h.initiator, outsider, 7);
  CHECK(no_key.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(Contains(no_key.status(), "no key for job 7"));
  // A proof made with its own job's key under job 7's number.
  auto forged = JobProof(*h.initiator, outsider, 8);
  REQUIRE(forged.ok());
  CHECK(AcceptJobProof(*h.acceptor, member, 7, *forged).code() ==
        absl::StatusCode::kPermissionDenied);
  // And job 8, which the acceptor holds no key for, is refused with why.
  absl::Status unknown = AcceptJobProof(*h.acceptor, member, 8, *forged);
  CHECK(Contains(unknown, "job 8: this daemon holds no key for it"));
  CHECK_FALSE(h.acceptor->Allows(7));
}

TEST_CASE("a wrong cluster key is refused at both ends, with the reason") {
  DataKeys cluster;
  cluster.SetClusterKey("cluster key");
  DataKeys stranger;
  stranger.SetClusterKey("another cluster");
  // The stranger initiates: it finds the acceptor's proof wrong and stops.
  Handshake h = Run(stranger, cluster);
  REQUIRE_FALSE(h.initiator.ok());
  CHECK(h.initiator.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(Contains(h.initiator.status(), "does not hold this cluster's data key"));
  REQUIRE_FALSE(h.acceptor.ok());  // it saw the connection end

  // A peer that answers the challenge with a wrong proof is told why.
  SocketPair pair;
  auto acceptor = std::async(std::launch::async, [&] {
    return AcceptorHandshake(pair.fds[1], cluster, "10.0.0.9:5000");
  });
  std::string hello = std::string("MLFA") + '\1' + '\2' + std::string(2, '\0') +
                      std::string(32, 'n') + "w9";
  REQUIRE(::write(pair.fds[0], hello.data(), hello.size()) == static_cast<ssize_t>(hello.size()));
  char challenge[68];
  REQUIRE(::read(pair.fds[0], challenge, sizeof(challenge)) == 68);
  const std::string wrong(32, 'x');
  REQUIRE(::write(pair.fds[0], wrong.data(), wrong.size()) == 32);
  auto refused = acceptor.get();
  REQUIRE_FALSE(refused.ok());
  CHECK(Contains(refused.status(), "data session from 10.0.0.9:5000 (says it is 'w9'): wrong cluster data key"));
  char verdict[64] = {};
  const ssize_t n = ::read(pair.fds[0], verdict, sizeof(verdict));
  REQUIRE(n > 2);
  CHECK(verdict[0] == 1);
  CHECK(std::string(verdict + 2, n - 2) == "wrong cluster data key");
}

TEST_CASE("a session that skips the handshake is refused; none is made without a key") {
  DataKeys cluster;
  cluster.SetClusterKey("cluster key");
  SocketPair pair;
  auto acceptor = std::async(std::launch::async, [&] {
    return AcceptorHandshake(pair.fds[1], cluster, "10.0.0.3:1");
  });
  const std::string packet(40, 'M');  // a data packet's first bytes, say
  REQUIRE(::write(pair.fds[0], packet.data(), packet.size()) == 40);
  auto refused = acceptor.get();
  REQUIRE_FALSE(refused.ok());
  CHECK(Contains(refused.status(), "did not start with the authentication handshake"));

  DataKeys off;
  CHECK_FALSE(off.enabled());
  Handshake none = Run(off, off);
  REQUIRE(none.initiator.ok());
  REQUIRE(none.acceptor.ok());
  CHECK_FALSE(none.acceptor->enabled);
  CHECK(none.acceptor->Allows(12345));
}

TEST_CASE("encryption: both ends seal or the acceptor refuses, saying why") {
  DataKeys sealed;
  sealed.SetClusterKey("cluster key");
  sealed.SetEncryption(true);
  CHECK(sealed.encryption());
  DataKeys plain;
  plain.SetClusterKey("cluster key");
  Handshake both = Run(sealed, sealed);
  REQUIRE(both.initiator.ok());
  REQUIRE(both.acceptor.ok());
  CHECK(both.initiator->sealed);
  CHECK(both.acceptor->sealed);
  // The transcript the MACs and job proofs cover holds both public keys.
  CHECK(both.initiator->nonces == both.acceptor->nonces);
  CHECK(both.initiator->nonces.size() == 128);

  for (const auto& [initiator, acceptor] :
       {std::pair<const DataKeys*, const DataKeys*>{&sealed, &plain}, {&plain, &sealed}}) {
    Handshake mixed = Run(*initiator, *acceptor);
    REQUIRE_FALSE(mixed.initiator.ok());
    REQUIRE_FALSE(mixed.acceptor.ok());
    CHECK(Contains(mixed.initiator.status(), "refused: data_plane_encryption is"));
    CHECK(Contains(mixed.acceptor.status(), "(both must have it from the same scheduler)"));
  }

  DataKeys no_key;  // encryption needs the cluster key: without it, nothing is on
  no_key.SetEncryption(true);
  CHECK_FALSE(no_key.encryption());
}

TEST_CASE("a job key that arrives a moment late is waited for") {
  DataKeys keys;
  auto later = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    keys.SetJobKey(3, "k");
  });
  CHECK(keys.JobKey(3, std::chrono::milliseconds(5000)).value_or("") == "k");
  later.get();
  CHECK_FALSE(keys.JobKey(4).has_value());
}

}  // namespace
}  // namespace mlfabric::transport
