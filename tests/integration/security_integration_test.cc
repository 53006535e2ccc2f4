// Integration: the security properties of attention-server (README "Security"), each against the
// real binary on loopback with throwaway certificates made by openssl:
// TLS (plaintext clients fail), mutual TLS (no client certificate or one from another CA fails;
// the certificate names the identity), the plaintext health-only listener (answers health,
// nothing else), bearer tokens on every RPC (missing and unknown tokens get the same
// UNAUTHENTICATED), sequences invisible (NOT_FOUND) to other identities on every sequence RPC,
// per-identity sequence/page limits and the per-request tensor element limit
// (RESOURCE_EXHAUSTED with the numbers, the other identity unharmed), metrics without a token,
// bad files failing start-up with exit status 2, and SIGHUP reloading the token file.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>

#include "attention/v1/sequence.grpc.pb.h"
#include "request_builder.h"
#include "server_process.h"
#include "tls_test_certs.h"

namespace attn::testing {
namespace {

namespace pb = attention::v1;

constexpr char kAliceToken[] = "alice-token-0123456789abcdef";
constexpr char kBobToken[] = "bob-token-fedcba9876543210";
constexpr int kPage = 4, kK = 1, kN = 2, kH = 8;

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new TlsTestCerts(MakeTlsTestCerts());
    tokens_ = certs_->dir + "/tokens";
    std::ofstream(tokens_) << "# identity token\n\nalice " << kAliceToken << "\n  bob\t"
                           << kBobToken << "\n";
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(certs_->error.empty()) << certs_->error; }

  void Start(std::vector<std::string> args) {
    server_ = std::make_unique<ServerProcess>(args);
    ASSERT_TRUE(server_->started()) << server_->ReadLog();
  }
  // A TLS channel trusting the test CA; with a client certificate when given.
  std::shared_ptr<grpc::Channel> Tls(const std::string& cert = "", const std::string& key = "") {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = ReadTextFile(certs_->ca_pem);
    if (!cert.empty()) {
      o.pem_cert_chain = ReadTextFile(cert);
      o.pem_private_key = ReadTextFile(key);
    }
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    args.SetMaxReceiveMessageSize(-1);
    return grpc::CreateCustomChannel(server_->address(), grpc::SslCredentials(o), args);
  }
  static void Ctx(grpc::ClientContext* c, const std::string& token) {
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
  }
  static grpc::Status Info(const std::shared_ptr<grpc::Channel>& ch, const std::string& token) {
    auto stub = pb::AttentionService::NewStub(ch);
    grpc::ClientContext c;
    Ctx(&c, token);
    pb::GetServerInfoResponse r;
    return stub->GetServerInfo(&c, pb::GetServerInfoRequest(), &r);
  }
  static pb::CreateSequenceRequest CreateReq(int64_t reserve) {
    pb::CreateSequenceRequest r;
    r.set_num_layers(1);
    r.set_num_kv_heads(kK);
    r.set_num_heads(kN);
    r.set_head_dim(kH);
    r.set_dtype(pb::FLOAT32);
    r.set_reserve_tokens(reserve);
    return r;
  }
  static pb::ExtendRequest Step(const std::string& id, int64_t pos, int64_t T, uint64_t seed = 1) {
    std::mt19937_64 rng(seed);
    pb::ExtendRequest r;
    r.set_sequence_id(id);
    r.set_layer(0);
    r.set_position(pos);
    FillTensor(r.mutable_q(), pb::FLOAT32, {T, kN, kH}, &rng);
    FillTensor(r.mutable_k(), pb::FLOAT32, {T, kK, kH}, &rng);
    FillTensor(r.mutable_v(), pb::FLOAT32, {T, kK, kH}, &rng);
    return r;
  }
  // Per-call helpers on the sequence service; `who` is a token (token mode) or "".
  grpc::Status Create(pb::SequenceService::Stub* s, const std::string& who, int64_t reserve,
                      std::string* id) {
    grpc::ClientContext c;
    Ctx(&c, who);
    pb::CreateSequenceResponse r;
    grpc::Status st = s->CreateSequence(&c, CreateReq(reserve), &r);
    if (id != nullptr) *id = r.sequence().sequence_id();
    return st;
  }
  grpc::Status Extend(pb::SequenceService::Stub* s, const std::string& who,
                      const pb::ExtendRequest& req) {
    grpc::ClientContext c;
    Ctx(&c, who);
    pb::ExtendResponse r;
    return s->Extend(&c, req, &r);
  }
  grpc::Status Get(pb::SequenceService::Stub* s, const std::string& who, const std::string& id,
                   pb::SequenceInfo* info = nullptr) {
    grpc::ClientContext c;
    Ctx(&c, who);
    pb::GetSequenceRequest req;
    req.set_sequence_id(id);
    pb::GetSequenceResponse r;
    grpc::Status st = s->GetSequence(&c, req, &r);
    if (info != nullptr) *info = r.sequence();
    return st;
  }
  grpc::Status Release(pb::SequenceService::Stub* s, const std::string& who,
                       const std::string& id) {
    grpc::ClientContext c;
    Ctx(&c, who);
    pb::ReleaseSequenceRequest req;
    req.set_sequence_id(id);
    pb::ReleaseSequenceResponse r;
    return s->ReleaseSequence(&c, req, &r);
  }
  grpc::Status Fork(pb::SequenceService::Stub* s, const std::string& who, const std::string& id,
                    std::string* child) {
    grpc::ClientContext c;
    Ctx(&c, who);
    pb::ForkSequenceRequest req;
    req.set_sequence_id(id);
    pb::ForkSequenceResponse r;
    grpc::Status st = s->ForkSequence(&c, req, &r);
    if (child != nullptr) *child = r.sequence().sequence_id();
    return st;
  }
  // The number logged after `prefix` (e.g. the metrics or health port); 0 when absent.
  int LoggedPort(const std::string& pattern) {
    std::smatch m;
    const std::string log = server_->ReadLog();
    if (std::regex_search(log, m, std::regex(pattern))) return std::stoi(m[1]);
    return 0;
  }

  static TlsTestCerts* certs_;
  static std::string tokens_;
  std::unique_ptr<ServerProcess> server_;
};

TlsTestCerts* SecurityTest::certs_ = nullptr;
std::string SecurityTest::tokens_;

// Any unary method by name with raw request bytes (empty: the default message).
grpc::Status GenericCall(const std::shared_ptr<grpc::Channel>& ch, const std::string& method,
                         const std::string& token, const std::string& bytes = "") {
  grpc::GenericStub stub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return status;
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST_F(SecurityTest, TlsListenerRefusesPlaintextAndServesTls) {
  Start({"--tls-cert", certs_->server_pem, "--tls-key", certs_->server_key});
  EXPECT_TRUE(Info(Tls(), "").ok());
  const grpc::Status plain = Info(server_->Channel(), "");
  EXPECT_EQ(plain.error_code(), grpc::StatusCode::UNAVAILABLE) << plain.error_message();
}

TEST_F(SecurityTest, MutualTlsRequiresACertificateFromTheClientCa) {
  Start({"--tls-cert", certs_->server_pem, "--tls-key", certs_->server_key, "--tls-client-ca",
         certs_->ca_pem, "--kv-page-tokens", std::to_string(kPage)});
  EXPECT_EQ(Info(Tls(), "").error_code(), grpc::StatusCode::UNAVAILABLE);  // no certificate
  EXPECT_EQ(Info(Tls(certs_->rogue_pem, certs_->rogue_key), "").error_code(),
            grpc::StatusCode::UNAVAILABLE);  // a certificate from another CA
  EXPECT_EQ(Info(server_->Channel(), "").error_code(), grpc::StatusCode::UNAVAILABLE);
  auto alice = pb::SequenceService::NewStub(Tls(certs_->alice_pem, certs_->alice_key));
  auto bob = pb::SequenceService::NewStub(Tls(certs_->bob_pem, certs_->bob_key));
  // Without a token file the certificate's SAN is the identity.
  std::string id;
  ASSERT_TRUE(Create(alice.get(), "", 0, &id).ok());
  EXPECT_TRUE(Get(alice.get(), "", id).ok());
  EXPECT_EQ(Get(bob.get(), "", id).error_code(), grpc::StatusCode::NOT_FOUND);
  // x-attn-identity cannot claim another identity.
  grpc::ClientContext c;
  Ctx(&c, "");
  c.AddMetadata("x-attn-identity", "alice.clients.test");
  pb::GetSequenceRequest req;
  req.set_sequence_id(id);
  pb::GetSequenceResponse resp;
  EXPECT_EQ(bob->GetSequence(&c, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(SecurityTest, HealthPortIsPlaintextAndServesOnlyHealth) {
  Start({"--tls-cert", certs_->server_pem, "--tls-key", certs_->server_key, "--tls-client-ca",
         certs_->ca_pem, "--health-address", "127.0.0.1:0"});
  const int health_port = LoggedPort("health listener: \\S+ port (\\d+)");
  ASSERT_GT(health_port, 0) << server_->ReadLog();
  auto health = grpc::CreateChannel("127.0.0.1:" + std::to_string(health_port),
                                    grpc::InsecureChannelCredentials());
  EXPECT_EQ(HealthCheck(health, ""), "SERVING");
  EXPECT_EQ(HealthCheck(health, "attention.v1.AttentionService"), "SERVING");
  EXPECT_EQ(HealthCheck(health, "attention.v1.SequenceService"), "SERVING");
  // The main port needs mutual TLS even for health; the health port serves nothing else.
  EXPECT_EQ(HealthCheck(server_->Channel(), ""), "rpc error: 14");
  EXPECT_EQ(Info(health, kAliceToken).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  auto stub = pb::AttentionService::NewStub(health);
  grpc::ClientContext c;
  Ctx(&c, "");
  pb::AttendResponse r;
  EXPECT_EQ(stub->Attend(&c, PaddedRequest(1, 4, 4, 2, 2, 8, pb::FLOAT32), &r).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(GenericCall(health, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                        "")
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  // Both listeners stop cleanly on SIGTERM.
  server_->Signal(SIGTERM);
  EXPECT_EQ(server_->WaitExit(20), 0);
}

TEST_F(SecurityTest, EveryRpcNeedsAKnownBearerToken) {
  Start({"--tls-cert", certs_->server_pem, "--tls-key", certs_->server_key, "--auth-token-file",
         tokens_});
  auto ch = Tls();
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  int methods = 0;
  for (const char* service : {"attention.v1.AttentionService", "attention.v1.SequenceService"}) {
    const auto* sd = pool->FindServiceByName(service);
    ASSERT_NE(sd, nullptr) << service;
    for (int i = 0; i < sd->method_count(); ++i) {
      const std::string method = "/" + std::string(service) + "/" + sd->method(i)->name();
      const grpc::Status none = GenericCall(ch, method, "");
      const grpc::Status wrong = GenericCall(ch, method, "not-a-known-token-0000000000");
      const grpc::Status prefix = GenericCall(ch, method, std::string(kAliceToken).substr(0, 20));
      EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
      EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
      EXPECT_EQ(prefix.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
      // The same message for a missing and an unknown token: nothing tells which.
      EXPECT_EQ(none.error_message(), wrong.error_message()) << method;
      ++methods;
    }
  }
  EXPECT_GE(methods, 10);
  EXPECT_TRUE(Info(ch, kAliceToken).ok());
  EXPECT_TRUE(Info(ch, kBobToken).ok());
  {  // the scheme is case-insensitive; the token is not
    auto stub = pb::AttentionService::NewStub(ch);
    grpc::ClientContext c;
    c.AddMetadata("authorization", std::string("bearer ") + kAliceToken);
    pb::GetServerInfoResponse r;
    EXPECT_TRUE(stub->GetServerInfo(&c, pb::GetServerInfoRequest(), &r).ok());
  }
  // Health needs no token; reflection is off with tokens (it could not check them).
  EXPECT_EQ(HealthCheck(ch, ""), "SERVING");
  EXPECT_EQ(GenericCall(ch, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                        kAliceToken)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(SecurityTest, SequencesAreInvisibleToOtherIdentities) {
  Start({"--auth-token-file", tokens_, "--kv-page-tokens", std::to_string(kPage)});
  auto s = pb::SequenceService::NewStub(server_->Channel());
  std::string id;
  ASSERT_TRUE(Create(s.get(), kAliceToken, 8, &id).ok());
  ASSERT_TRUE(Extend(s.get(), kAliceToken, Step(id, 0, 3)).ok());
  // Bob, on every sequence RPC: NOT_FOUND, exactly as for an id that does not exist.
  const grpc::Status unknown = Get(s.get(), kBobToken, std::string(32, 'a'));
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Get(s.get(), kBobToken, id).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Extend(s.get(), kBobToken, Step(id, 3, 1)).error_code(),
            grpc::StatusCode::NOT_FOUND);
  {
    grpc::ClientContext c;
    Ctx(&c, kBobToken);
    pb::ExtendBatchRequest req;
    *req.add_steps() = Step(id, 3, 1);
    pb::ExtendBatchResponse r;
    ASSERT_TRUE(s->ExtendBatch(&c, req, &r).ok());
    ASSERT_EQ(r.results_size(), 1);
    EXPECT_EQ(r.results(0).code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  }
  {
    grpc::ClientContext c;
    Ctx(&c, kBobToken);
    auto stream = s->ExtendStream(&c);
    ASSERT_TRUE(stream->Write(Step(id, 3, 1)));
    pb::ExtendResult r;
    ASSERT_TRUE(stream->Read(&r));
    EXPECT_EQ(r.code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  {
    grpc::ClientContext c;
    Ctx(&c, kBobToken);
    pb::TruncateSequenceRequest req;
    req.set_sequence_id(id);
    req.set_length(0);
    pb::TruncateSequenceResponse r;
    EXPECT_EQ(s->TruncateSequence(&c, req, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_EQ(Fork(s.get(), kBobToken, id, nullptr).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Release(s.get(), kBobToken, id).error_code(), grpc::StatusCode::NOT_FOUND);
  {  // a claimed x-attn-identity changes nothing in token mode
    grpc::ClientContext c;
    Ctx(&c, kBobToken);
    c.AddMetadata("x-attn-identity", "alice");
    pb::GetSequenceRequest req;
    req.set_sequence_id(id);
    pb::GetSequenceResponse r;
    EXPECT_EQ(s->GetSequence(&c, req, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // Alice's sequence is untouched: same length, extends at position 3.
  pb::SequenceInfo info;
  ASSERT_TRUE(Get(s.get(), kAliceToken, id, &info).ok());
  ASSERT_EQ(info.layer_lengths_size(), 1);
  EXPECT_EQ(info.layer_lengths(0), 3);
  EXPECT_TRUE(Extend(s.get(), kAliceToken, Step(id, 3, 1)).ok());
  EXPECT_TRUE(Release(s.get(), kAliceToken, id).ok());
}

TEST_F(SecurityTest, PerIdentityPageAndSequenceLimits) {
  Start({"--auth-token-file", tokens_, "--kv-page-tokens", std::to_string(kPage),
         "--max-pages-per-identity", "8", "--max-sequences-per-identity", "3"});
  auto s = pb::SequenceService::NewStub(server_->Channel());
  // A: 6 tokens = 2 pages (last one partial). Its fork shares both: still 2 pages.
  std::string a, f, b;
  ASSERT_TRUE(Create(s.get(), kAliceToken, 0, &a).ok());
  ASSERT_TRUE(Extend(s.get(), kAliceToken, Step(a, 0, 6)).ok());
  ASSERT_TRUE(Fork(s.get(), kAliceToken, a, &f).ok());
  // 6 more pages fit exactly only if the fork's shared pages were not charged again.
  grpc::Status st = Create(s.get(), kAliceToken, 6 * kPage, &b);
  ASSERT_TRUE(st.ok()) << st.error_message();
  // The fork's copy-on-write of its partial last page needs a 9th page.
  st = Extend(s.get(), kAliceToken, Step(f, 6, 1));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("holds 8 KV pages"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("is 8; requested 1"), std::string::npos) << st.error_message();
  // A fourth sequence is over the sequence limit.
  st = Create(s.get(), kAliceToken, 0, nullptr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(st.error_message().find("has 3 live sequences"), std::string::npos)
      << st.error_message();
  // Nothing stored was harmed, and Bob is not limited by Alice's usage.
  pb::SequenceInfo info;
  ASSERT_TRUE(Get(s.get(), kAliceToken, f, &info).ok());
  EXPECT_EQ(info.layer_lengths(0), 6);
  ASSERT_TRUE(Get(s.get(), kAliceToken, a, &info).ok());
  EXPECT_EQ(info.layer_lengths(0), 6);
  std::string bob_seq;
  st = Create(s.get(), kBobToken, 8 * kPage, &bob_seq);
  EXPECT_TRUE(st.ok()) << st.error_message();
  // Releasing B returns its 6 pages: the copy-on-write now fits.
  ASSERT_TRUE(Release(s.get(), kAliceToken, b).ok());
  st = Extend(s.get(), kAliceToken, Step(f, 6, 1));
  EXPECT_TRUE(st.ok()) << st.error_message();
  // With everything released Alice is back to 0: the whole quota is available again.
  ASSERT_TRUE(Release(s.get(), kAliceToken, a).ok());
  ASSERT_TRUE(Release(s.get(), kAliceToken, f).ok());
  st = Create(s.get(), kAliceToken, 8 * kPage, &b);
  EXPECT_TRUE(st.ok()) << st.error_message();
  st = Create(s.get(), kAliceToken, 1, nullptr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(SecurityTest, TensorElementLimitPerRequest) {
  // q (1,16,2,8) = 256 elements, k and v (1,32,2,8) = 512 each: 1280 in all.
  Start({"--auth-token-file", tokens_, "--max-tensor-elements", "1279", "--kv-page-tokens",
         std::to_string(kPage)});
  auto stub = pb::AttentionService::NewStub(server_->Channel());
  {
    grpc::ClientContext c;
    Ctx(&c, kAliceToken);
    pb::AttendResponse r;
    const grpc::Status st = stub->Attend(&c, PaddedRequest(1, 16, 32, 2, 2, 8, pb::FLOAT32), &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(st.error_message().find("1280"), std::string::npos) << st.error_message();
    EXPECT_NE(st.error_message().find("1279"), std::string::npos) << st.error_message();
  }
  {
    grpc::ClientContext c;
    Ctx(&c, kBobToken);
    pb::AttendResponse r;
    const grpc::Status st = stub->Attend(&c, PaddedRequest(1, 16, 31, 2, 2, 8, pb::FLOAT32), &r);
    EXPECT_TRUE(st.ok()) << st.error_message();
  }
  // Extend: T=80 gives 80*(2+1+1)*8 = 2560 elements; the sequence is not changed.
  auto s = pb::SequenceService::NewStub(server_->Channel());
  std::string id;
  ASSERT_TRUE(Create(s.get(), kAliceToken, 0, &id).ok());
  EXPECT_EQ(Extend(s.get(), kAliceToken, Step(id, 0, 80)).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  pb::SequenceInfo info;
  ASSERT_TRUE(Get(s.get(), kAliceToken, id, &info).ok());
  EXPECT_EQ(info.layer_lengths(0), 0);
  EXPECT_TRUE(Extend(s.get(), kAliceToken, Step(id, 0, 8)).ok());
}

TEST_F(SecurityTest, MetricsNeedNoTokenOnTheirOwnListener) {
  Start({"--auth-token-file", tokens_, "--metrics-address", "127.0.0.1:0"});
  const int port = LoggedPort("metrics: http://127\\.0\\.0\\.1:(\\d+)/metrics");
  ASSERT_GT(port, 0) << server_->ReadLog();
  ASSERT_NE(port, server_->port());
  const std::string body = HttpGet(port, "/metrics");
  EXPECT_NE(body.find("200 OK"), std::string::npos) << body.substr(0, 200);
  EXPECT_NE(body.find("attn_"), std::string::npos);
}

TEST_F(SecurityTest, BadSecurityConfigurationFailsStartWithStatus2) {
  const std::string missing = certs_->dir + "/does-not-exist.pem";
  const std::string bad_tokens = certs_->dir + "/bad-tokens";
  std::ofstream(bad_tokens) << "alice sh0rt-t0ken\n";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tls-cert", missing, "--tls-key", certs_->server_key}, "--tls-cert: cannot read"},
      {{"--tls-cert", certs_->server_pem, "--tls-key", certs_->alice_key}, "does not match"},
      {{"--tls-cert", certs_->server_pem}, "must be given together"},
      {{"--tls-cert", certs_->server_key, "--tls-key", certs_->server_key}, "no PEM certificate"},
      {{"--tls-client-ca", certs_->ca_pem}, "needs --tls-cert"},
      {{"--tls-cert", certs_->server_pem, "--tls-key", certs_->server_key, "--tls-client-ca",
        certs_->server_key},
       "--tls-client-ca"},
      {{"--auth-token-file", missing}, "--auth-token-file: cannot read"},
      {{"--auth-token-file", bad_tokens}, ":1: token must be"},
  };
  for (const auto& [args, message] : cases) {
    ServerProcess p(args);
    EXPECT_FALSE(p.started());
    EXPECT_EQ(p.WaitExit(20), 2) << args[0] << "\n" << p.ReadLog();
    EXPECT_NE(p.ReadLog().find(message), std::string::npos) << p.ReadLog();
    EXPECT_EQ(p.ReadLog().find("sh0rt-t0ken"), std::string::npos) << "a token was echoed";
  }
}

TEST_F(SecurityTest, SighupReloadsTheTokenFile) {
  const std::string file = certs_->dir + "/rotating-tokens";
  std::ofstream(file) << "alice " << kAliceToken << "\n";
  Start({"--auth-token-file", file});
  EXPECT_TRUE(Info(server_->Channel(), kAliceToken).ok());
  EXPECT_EQ(Info(server_->Channel(), kBobToken).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  std::ofstream(file) << "bob " << kBobToken << "\n";
  server_->Signal(SIGHUP);
  bool rotated = false;
  for (int i = 0; i < 100 && !rotated; ++i) {
    rotated = Info(server_->Channel(), kBobToken).ok();
    if (!rotated) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(rotated) << server_->ReadLog();
  EXPECT_EQ(Info(server_->Channel(), kAliceToken).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // A broken file keeps the tokens in force.
  std::ofstream(file) << "not a valid line at all\n";
  server_->Signal(SIGHUP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(Info(server_->Channel(), kBobToken).ok());
  EXPECT_NE(server_->ReadLog().find("token file not reloaded"), std::string::npos);
}

#ifdef ATTN_LOADGEN_BIN
// attention-loadgen's --tls-ca/--tls-cert/--tls-key/--tls-server-name/--token-file against a
// mutual-TLS + token server: stateless and session workloads succeed with them, fail without.
TEST_F(SecurityTest, LoadgenConnectsWithMutualTlsAndAToken) {
  Start({"--tls-cert", certs_->server_pem, "--tls-key", certs_->server_key, "--tls-client-ca",
         certs_->ca_pem, "--auth-token-file", tokens_, "--default-backend", "cpu"});
  const std::string token_file = certs_->dir + "/alice.token";
  std::ofstream(token_file) << kAliceToken << "\n";
  const std::string base = std::string(ATTN_LOADGEN_BIN) + " --target " + server_->address() +
                           " --tls-ca " + certs_->ca_pem + " --tls-cert " + certs_->alice_pem +
                           " --tls-key " + certs_->alice_key +
                           " --tls-server-name localhost --quiet --fail-on-error" +
                           " --heads 2 --kv-heads 2 --head-dim 8 --dtype fp32";
  const std::string out = " > " + certs_->dir + "/loadgen.log 2>&1";
  const std::string fixed = " --workload fixed --fixed-tokens 8 --requests 4";
  const std::string session = " --workload session --fixed-tokens 8 --max-gen 2 --requests 2";
  EXPECT_EQ(std::system((base + " --token-file " + token_file + fixed + out).c_str()), 0)
      << ReadTextFile(certs_->dir + "/loadgen.log");
  EXPECT_EQ(std::system((base + " --token-file " + token_file + session + out).c_str()), 0)
      << ReadTextFile(certs_->dir + "/loadgen.log");
  EXPECT_NE(std::system((base + fixed + out).c_str()), 0);  // no token
  EXPECT_NE(ReadTextFile(certs_->dir + "/loadgen.log").find("UNAUTHENTICATED"),
            std::string::npos)
      << ReadTextFile(certs_->dir + "/loadgen.log");
}
#endif

}  // namespace
}  // namespace attn::testing
