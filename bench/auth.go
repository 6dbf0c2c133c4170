package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// The "auth" run: what access control costs the publish and receive paths
// of the sidecar's gRPC API, through Google's Go client at 256 keys. Two
// whole sidecars run in this process over the bench's server, both serving
// TLS with the same certificate: one without access control, one with a
// token file and a project policy that grants the bench's principal
// roles/pubsub.publisher and roles/pubsub.subscriber. So the difference is
// authentication and authorization only: every unary call (Publish,
// Acknowledge, ModifyAckDeadline) is authenticated and authorized, and
// each StreamingPull stream once (the run checks first that the sidecar
// with access control refuses a call without a token). Each round
// measures raw JetStream first, then the two sidecars, in alternating
// order (off first in odd rounds, on first in even ones), so drift during
// a round does not land on one side. Besides messages/s the run reports
// the process's CPU time per message, which the machine's noise moves
// less, and the client's unary calls per message: authorization's cost is
// those calls times its cost per call (go test -bench . ./internal/iam).

var authTokens = flag.Int("auth-tokens", 1, "auth run: bearer tokens in the sidecar's token file (the bench's own among them)")

// authOutstanding is the client's MaxOutstandingMessages and the
// sidecar's --max-outstanding-messages in the auth run: with 1,000 (the
// defaults) pipelined delivery is bound by the Go client's 100 ms ack
// batches, not by CPU, and a per-call cost would not show.
const authOutstanding = 10_000

// authPrincipal is the principal the auth run's token names.
const authPrincipal = "serviceAccount:bench"

// authSide is one sidecar of the auth run and Google's Go client for it;
// calls counts the client's unary calls.
type authSide struct {
	addr   string
	client *pubsub.Client
	calls  *atomic.Int64
	stop   func()
}

// authSample is one measurement of a sidecar: messages/s; the CPU time
// the whole process used per message, from the first message to the last
// (the client, the sidecar, the server, and the other sidecar idling);
// and the client's unary calls.
type authSample struct {
	rate  float64
	cpu   time.Duration
	calls int64
}

// authFigures are one round's figures: raw JetStream's messages/s, the
// sidecar over TLS without access control (off) and with it (on).
type authFigures struct {
	raw     float64
	off, on authSample
}

func (b *bench) auth() chart {
	dir := filepath.Join(b.tmp, "auth")
	check(os.MkdirAll(dir, 0o700))
	pool, certFile, keyFile := writeBenchCerts(dir)
	token := "bench-" + rand.Text()
	tokensFile, policyFile := writeAccessFiles(dir, token, *authTokens)
	creds := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool}))
	cfg := sidecar.Config{GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", TLSCert: certFile, TLSKey: keyFile,
		NATSURL: b.nc.ConnectedUrl(), Project: project, MaxOutstandingMessages: authOutstanding, ShutdownTimeout: 5 * time.Second}
	off := startAuthSide(cfg, option.WithoutAuthentication(), option.WithGRPCDialOption(creds))
	defer off.stop()
	cfg.AuthTokens, cfg.IAMPolicy = tokensFile, policyFile
	on := startAuthSide(cfg, option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token, TokenType: "Bearer",
		Expiry: time.Now().Add(24 * time.Hour)})), option.WithGRPCDialOption(creds))
	defer on.stop()
	on.checkEnforced(b, creds)

	const keys = 256
	// Strict ordering moves about 2,560 messages/s at 256 keys through the
	// Go client (a key's next message waits for the ack, which the client
	// sends every 100 ms): fewer of them.
	pubMsgs, strictMsgs, pipedMsgs := n(100_000), n(10_000), n(100_000)
	fmt.Printf("auth: Google's Go client through the sidecar over TLS, without (off) and with (on) access control (%s in the token file; "+
		"a policy granting roles/pubsub.publisher and roles/pubsub.subscriber); %d keys; %d outstanding (client and sidecar); "+
		"CPU: the process's, per message\n", plural(*authTokens, "token"), keys, authOutstanding)
	fmt.Printf("%-5s %-8s %-34s %9s %9s %9s %7s %7s %7s   %8s %8s %7s   %s\n", "round", "order", "auth run", "raw", "off", "on",
		"on/off", "off/raw", "on/raw", "CPU off", "CPU on", "on/off", "unary calls off, on")
	runs := []struct {
		name, title string
		msgs        int
		measure     func(s *authSide) authSample
		raw         func() float64
		rounds      []authFigures
	}{
		{name: fmt.Sprintf("publish, %s", plural(pubMsgs, "msg")), msgs: pubMsgs,
			title:   fmt.Sprintf("publishing %s messages round-robin over the keys, every result awaited: messages/s", count(float64(pubMsgs))),
			measure: func(s *authSide) authSample { return b.goClientPublish(s, keys, pubMsgs) },
			raw:     func() float64 { return b.rawKeyedPublish(keys, pubMsgs) }},
		{name: fmt.Sprintf("receive, strict, %s", plural(strictMsgs, "msg")), msgs: strictMsgs,
			title:   fmt.Sprintf("receiving %s messages, strict ordering (the default), partitioned, acked at once: messages/s", count(float64(strictMsgs))),
			measure: func(s *authSide) authSample { return b.goClientReceive(s, keys, strictMsgs, "strict") },
			raw:     func() float64 { return b.raw("raw-map1000", strictMsgs, 1000) }},
		{name: fmt.Sprintf("receive, pipelined, %s", plural(pipedMsgs, "msg")), msgs: pipedMsgs,
			title:   fmt.Sprintf("receiving %s messages, pipelined ordering, partitioned, acked at once: messages/s", count(float64(pipedMsgs))),
			measure: func(s *authSide) authSample { return b.goClientReceive(s, keys, pipedMsgs, "pipelined") },
			raw:     func() float64 { return b.raw("raw-map1000", pipedMsgs, 1000) }},
	}
	for round := 1; round <= *rounds; round++ {
		order := "off, on"
		if round%2 == 0 {
			order = "on, off"
		}
		for i := range runs {
			r := &runs[i]
			var f authFigures
			// Each measurement starts from a collected heap, so that one's
			// garbage is not collected in the next one's time.
			measure := func(s *authSide) authSample { runtime.GC(); return r.measure(s) }
			runtime.GC()
			f.raw = r.raw()
			if round%2 == 1 {
				f.off, f.on = measure(off), measure(on)
			} else {
				f.on, f.off = measure(on), measure(off)
			}
			r.rounds = append(r.rounds, f)
			fmt.Printf("%-5d %-8s %-34s %9.0f %9.0f %9.0f %6.3fx %6.3fx %6.3fx   %8s %8s %6.3fx   %d, %d\n", round, order, r.name,
				f.raw, f.off.rate, f.on.rate, f.on.rate/f.off.rate, f.off.rate/f.raw, f.on.rate/f.raw,
				micros(f.off.cpu), micros(f.on.cpu), f.on.cpu.Seconds()/f.off.cpu.Seconds(), f.off.calls, f.on.calls)
		}
	}
	c := chart{name: "auth", title: "Access control: Google's Go client through the sidecar over TLS, without and with it, " + plural(keys, "key"),
		note: fmt.Sprintf("median of %s, without and with access control in alternating order, a ratio the median of each round's; %s in the token file",
			plural(*rounds, "round"), plural(*authTokens, "token"))}
	fmt.Printf("\nauth, %d keys, median of %s (range in brackets); the target: access control costs at most 5%% of the messages/s (on/off at least 0.95x)\n",
		keys, plural(*rounds, "round"))
	for _, r := range runs {
		col := func(v func(authFigures) float64) []float64 {
			out := make([]float64, len(r.rounds))
			for i, f := range r.rounds {
				out[i] = v(f)
			}
			return out
		}
		onOff := col(func(f authFigures) float64 { return f.on.rate / f.off.rate })
		cpuOnOff := col(func(f authFigures) float64 { return f.on.cpu.Seconds() / f.off.cpu.Seconds() })
		offRaw, onRaw := median(col(func(f authFigures) float64 { return f.off.rate / f.raw })), median(col(func(f authFigures) float64 { return f.on.rate / f.raw }))
		raw, offs, ons := median(col(func(f authFigures) float64 { return f.raw })), median(col(func(f authFigures) float64 { return f.off.rate })),
			median(col(func(f authFigures) float64 { return f.on.rate }))
		callsPerK := median(col(func(f authFigures) float64 { return float64(f.on.calls) })) * 1000 / float64(r.msgs)
		fmt.Printf("  %-34s raw %7.0f msgs/s; off %7.0f (%.3fx raw); on %7.0f (%.3fx raw); on/off %.3fx [%.3f-%.3f]: costs %.1f%%, target %s\n",
			r.name, raw, offs, offRaw, ons, onRaw, median(onOff), slices.Min(onOff), slices.Max(onOff), (1-median(onOff))*100, verdict(median(onOff) >= 0.95))
		fmt.Printf("  %-34s CPU per message: off %s, on %s, on/off %.3fx [%.3f-%.3f]; %.1f unary calls per 1,000 messages\n", "",
			micros(time.Duration(median(col(func(f authFigures) float64 { return float64(f.off.cpu) })))),
			micros(time.Duration(median(col(func(f authFigures) float64 { return float64(f.on.cpu) })))),
			median(cpuOnOff), slices.Min(cpuOnOff), slices.Max(cpuOnOff), callsPerK)
		c.groups = append(c.groups, barGroup{title: r.title, bars: []bar{
			baseBar("raw JetStream", raw),
			rateBar("sidecar, TLS", offs, vs(offRaw, "raw")),
			rateBar("sidecar, TLS and access control", ons, vs(median(onOff), "TLS"), vs(onRaw, "raw")),
		}})
	}
	fmt.Println()
	return c
}

// micros writes a CPU time per message in microseconds.
func micros(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d)/1e3) }

// startAuthSide runs a whole sidecar with cfg in this process and returns
// Google's Go client for it, made with opts.
func startAuthSide(cfg sidecar.Config, opts ...option.ClientOption) *authSide {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan sidecar.Listening, 1)
	done := make(chan error, 1)
	go func() { done <- sidecar.Run(ctx, cfg, nil, func(l sidecar.Listening) { ready <- l }) }()
	var at sidecar.Listening
	select {
	case at = <-ready:
	case err := <-done:
		cancel()
		check(err)
	}
	calls := new(atomic.Int64)
	count := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		calls.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	c, err := pubsub.NewClient(context.Background(), project,
		append([]option.ClientOption{option.WithEndpoint(at.GRPC), option.WithTelemetryDisabled(), option.WithGRPCDialOption(count)}, opts...)...)
	check(err)
	return &authSide{addr: at.GRPC, client: c, calls: calls, stop: func() {
		_ = c.Close()
		cancel()
		if err := <-done; err != nil {
			fmt.Println("auth run: sidecar:", err)
		}
	}}
}

// checkEnforced checks that the sidecar refuses a publish without a token
// (UNAUTHENTICATED), so that the run measures access control enforced.
func (s *authSide) checkEnforced(b *bench, creds grpc.DialOption) {
	ctx := context.Background()
	c, err := pubsub.NewClient(ctx, project, option.WithEndpoint(s.addr), option.WithTelemetryDisabled(),
		option.WithoutAuthentication(), option.WithGRPCDialOption(creds))
	check(err)
	defer c.Close()
	topicID, _, _, cleanup := b.orderedTopic("auth-check")
	defer cleanup()
	p := c.Publisher(topicID)
	defer p.Stop()
	_, err = p.Publish(ctx, &pubsub.Message{Data: []byte("x")}).Get(ctx)
	if status.Code(err) != codes.Unauthenticated {
		check(fmt.Errorf("auth run: a publish without a token to the sidecar with access control: want UNAUTHENTICATED, got %v", err))
	}
}

// cpuWindow records the process's CPU time at a run's first and last
// message.
type cpuWindow struct {
	msgs        int64
	got         atomic.Int64
	first, last atomic.Int64
}

// message counts one message.
func (w *cpuWindow) message() {
	switch w.got.Add(1) {
	case 1:
		w.first.Store(int64(cpuTime()))
	case w.msgs:
		w.last.Store(int64(cpuTime()))
	}
}

// perMessage is the CPU time per message between the first and the last.
func (w *cpuWindow) perMessage() time.Duration {
	return time.Duration((w.last.Load() - w.first.Load()) / max(w.msgs-1, 1))
}

// goClientReceive fills a partitioned ordered subscription with msgs
// messages over keys keys and times Google's Go client receiving and
// acking them, from the first delivery, with the ordering the sidecar's
// label jetorder-ordering names ("strict" or "pipelined").
func (b *bench) goClientReceive(s *authSide, keys, msgs int, ordering string) authSample {
	cfg := adapter.SubscriptionConfig{Delivery: adapter.DeliveryPartitioned, Labels: map[string]string{"jetorder-ordering": ordering}}
	w := &cpuWindow{msgs: int64(msgs)}
	calls := s.calls.Load()
	rate := b.deliverIn(cfg, keys, msgs, func(sub *adapter.Subscription, done func()) func(context.Context) error {
		gs := s.client.Subscriber(sub.ID())
		gs.ReceiveSettings.MaxOutstandingMessages = authOutstanding
		return func(ctx context.Context) error {
			return gs.Receive(ctx, func(_ context.Context, m *pubsub.Message) { m.Ack(); w.message(); done() })
		}
	})
	return authSample{rate: rate, cpu: w.perMessage(), calls: s.calls.Load() - calls}
}

// goClientPublish times Google's Publisher with message ordering
// publishing msgs messages round-robin over keys keys into a new topic,
// every result awaited.
func (b *bench) goClientPublish(s *authSide, keys, msgs int) authSample {
	payload := make([]byte, *payloadSize)
	keyNames := make([]string, keys)
	for k := range keyNames {
		keyNames[k] = "key-" + strconv.Itoa(k)
	}
	var cpu time.Duration
	calls := s.calls.Load()
	rate := b.timedPublish(msgs, func(topicID string, _ *adapter.Topic) {
		start := cpuTime()
		orderedGoPublish(s.client, topicID, keyNames, msgs, payload)
		cpu = cpuTime() - start
	})
	return authSample{rate: rate, cpu: cpu / time.Duration(msgs), calls: s.calls.Load() - calls}
}

// rawKeyedPublish times raw JetStream async publishing of msgs messages
// round-robin over the subjects of keys keys of a new topic, with the
// ordering key header, every ack awaited: the publish run's "raw async".
func (b *bench) rawKeyedPublish(keys, msgs int) float64 {
	return b.timedPublish(msgs, func(topicID string, _ *adapter.Topic) {
		subject, hdr := keyed(topicID, "key", keys)
		b.fill(subject, hdr, msgs)
	})
}

// writeAccessFiles writes the auth run's token file, tokens lines with
// token (the bench's principal's) last, and its project policy, and
// returns their paths.
func writeAccessFiles(dir, token string, tokens int) (tokensFile, policyFile string) {
	var f strings.Builder
	f.WriteString("# principal token\n")
	for i := range max(tokens, 1) - 1 {
		fmt.Fprintf(&f, "user:u%d@example.com other-%d-%s\n", i, i, rand.Text())
	}
	fmt.Fprintf(&f, "%s %s\n", authPrincipal, token)
	tokensFile, policyFile = filepath.Join(dir, "tokens"), filepath.Join(dir, "policy.json")
	check(os.WriteFile(tokensFile, []byte(f.String()), 0o600))
	policy := `{"bindings":[{"role":"roles/pubsub.publisher","members":["` + authPrincipal + `"]},` +
		`{"role":"roles/pubsub.subscriber","members":["` + authPrincipal + `"]}]}`
	check(os.WriteFile(policyFile, []byte(policy), 0o600))
	return tokensFile, policyFile
}

// writeBenchCerts writes a self-signed CA and a server certificate it
// signed for 127.0.0.1 and localhost into dir, and returns a pool of the
// CA and the certificate's and its key's files.
func writeBenchCerts(dir string) (pool *x509.CertPool, certFile, keyFile string) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(err)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "jetorder bench CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	check(err)
	ca, err = x509.ParseCertificate(caDER)
	check(err)
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(err)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "server"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	check(err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	check(err)
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	check(os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	check(os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	return pool, certFile, keyFile
}
