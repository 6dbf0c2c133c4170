package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// The sidecar connects with --nats-url to a server that requires each kind
// of credential, and serves: a message published through its gRPC API is
// received. Wrong or missing credentials end Run at once with an
// authorization error, and a password in the URL does not show in it.
func TestSecurityNATSCredentials(t *testing.T) {
	dir := t.TempDir()
	nkeyUser, nkeySeed := newNkeyUser(t, dir, "user.nk")
	_, otherSeed := newNkeyUser(t, dir, "other.nk")
	op := newOperator(t)

	type badCase struct {
		name string
		cfg  func(url string) sidecar.Config
		want error
	}
	withURL := func(c sidecar.Config) func(string) sidecar.Config {
		return func(url string) sidecar.Config { c.NATSURL = url; return c }
	}
	for _, tc := range []struct {
		name      string
		configure func(*server.Options)
		good      sidecar.Config
		bad       []badCase
	}{
		{
			name:      "user-password",
			configure: func(o *server.Options) { o.Username, o.Password = "app", "s3cret-pw" },
			good:      sidecar.Config{NATSUser: "app", NATSPassword: "s3cret-pw"},
			bad: []badCase{
				{"wrong password", withURL(sidecar.Config{NATSUser: "app", NATSPassword: "nope"}), nats.ErrAuthorization},
				{"none", withURL(sidecar.Config{}), nats.ErrAuthorization},
				{"wrong password in the URL", func(url string) sidecar.Config {
					return sidecar.Config{NATSURL: strings.Replace(url, "nats://", "nats://app:url-pw-must-not-show@", 1)}
				}, nats.ErrAuthorization},
			},
		},
		{
			name:      "token",
			configure: func(o *server.Options) { o.Authorization = "s3cret-token" },
			good:      sidecar.Config{NATSToken: "s3cret-token"},
			bad: []badCase{
				{"wrong token", withURL(sidecar.Config{NATSToken: "nope"}), nats.ErrAuthorization},
				{"none", withURL(sidecar.Config{}), nats.ErrAuthorization},
			},
		},
		{
			name:      "nkey",
			configure: func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: nkeyUser}} },
			good:      sidecar.Config{NATSNKey: nkeySeed},
			bad: []badCase{
				{"another key", withURL(sidecar.Config{NATSNKey: otherSeed}), nats.ErrAuthorization},
				{"none", withURL(sidecar.Config{}), nats.ErrAuthorization},
				{"no seed file", withURL(sidecar.Config{NATSNKey: filepath.Join(dir, "missing.nk")}), os.ErrNotExist},
			},
		},
		{
			name:      "creds",
			configure: op.configure,
			good:      sidecar.Config{NATSCreds: op.creds(t, dir, "app.creds", true)},
			bad: []badCase{
				{"a user of another operator", withURL(sidecar.Config{NATSCreds: newOperator(t).creds(t, dir, "foreign.creds", true)}), nats.ErrAuthorization},
				{"none", withURL(sidecar.Config{}), nats.ErrAuthorization},
				// A known user of an account without JetStream: no point waiting.
				{"account without JetStream", withURL(sidecar.Config{NATSCreds: op.creds(t, dir, "nojs.creds", false)}), jetstream.ErrJetStreamNotEnabledForAccount},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := natsServerWith(t, tc.configure)
			good := tc.good
			good.NATSURL = srv.ClientURL()
			sc := itest.Start(t, good)
			roundTrip(t, sc.GoClient(), tc.name)

			for _, bad := range tc.bad {
				err := startFails(t, bad.cfg(srv.ClientURL()))
				if !errors.Is(err, bad.want) {
					t.Errorf("%s: Run = %v, want %v", bad.name, err, bad.want)
				}
				if err != nil && strings.Contains(err.Error(), "url-pw-must-not-show") {
					t.Errorf("%s: the error shows the password: %v", bad.name, err)
				}
			}
		})
	}
}

// The sidecar reaches a server that requires TLS when it trusts the
// server's CA, and one that also requires a client certificate when it has
// one; without the CA or the certificate Run ends at once with the TLS error.
func TestSecurityNATSTLS(t *testing.T) {
	certs := testutil.NewCerts(t)
	other := testutil.NewCerts(t) // a CA nobody here trusts
	for _, tc := range []struct {
		name         string
		verifyClient bool
		good         sidecar.Config
		bad          map[string]sidecar.Config
	}{
		{
			name: "server TLS",
			good: sidecar.Config{NATSTLSCA: certs.CA},
			bad: map[string]sidecar.Config{
				"no CA":    {},
				"wrong CA": {NATSTLSCA: other.CA},
			},
		},
		{
			name:         "client certificate",
			verifyClient: true,
			good:         sidecar.Config{NATSTLSCA: certs.CA, NATSTLSCert: certs.ClientCert, NATSTLSKey: certs.ClientKey},
			bad: map[string]sidecar.Config{
				"no client certificate":        {NATSTLSCA: certs.CA},
				"certificate of an unknown CA": {NATSTLSCA: certs.CA, NATSTLSCert: other.ClientCert, NATSTLSKey: other.ClientKey},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tlsConf, err := server.GenTLSConfig(&server.TLSConfigOpts{
				CertFile: certs.ServerCert, KeyFile: certs.ServerKey, CaFile: certs.CA, Verify: tc.verifyClient,
			})
			if err != nil {
				t.Fatal(err)
			}
			srv := natsServerWith(t, func(o *server.Options) {
				o.TLSConfig, o.TLS, o.TLSVerify, o.TLSTimeout = tlsConf, true, tc.verifyClient, 5
			})
			// The server requires TLS, so a nats:// URL upgrades to it too.
			good := tc.good
			good.NATSURL = strings.Replace(srv.ClientURL(), "tls://", "nats://", 1)
			sc := itest.Start(t, good)
			roundTrip(t, sc.GoClient(), "tls")

			for name, cfg := range tc.bad {
				cfg.NATSURL = srv.ClientURL()
				if err := startFails(t, cfg); !isTLSFailure(err) {
					t.Errorf("%s: Run = %v, want a TLS error", name, err)
				}
			}
		})
	}
}

// With --tls-cert and --tls-key both APIs serve TLS: a client that trusts
// the CA publishes and receives over gRPC and reads /healthz over HTTPS;
// plaintext clients and clients that do not trust the CA get nowhere.
func TestSecurityAPITLS(t *testing.T) {
	certs := testutil.NewCerts(t)
	sc := itest.Start(t, sidecar.Config{}, itest.TLS(certs))
	c := sc.GoClient()
	roundTrip(t, c, "api-tls")

	https := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certs.Pool}}}
	if code, body, err := httpGet(https, "https://"+sc.HTTP+"/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("GET /healthz over HTTPS = %d %q, %v; want 200", code, body, err)
	}

	// Plaintext and untrusting clients.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, creds := range map[string]credentials.TransportCredentials{
		"plaintext": insecure.NewCredentials(),
		"untrusted": credentials.NewTLS(&tls.Config{RootCAs: testutil.NewCerts(t).Pool}),
	} {
		bad := itest.Dial(t, sc.GRPC, grpc.WithTransportCredentials(creds))
		_, err := pb.NewPublisherClient(bad).GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath("api-tls")})
		_ = bad.Close()
		if err == nil {
			t.Errorf("gRPC %s: GetTopic succeeded", name)
		}
	}
	plain := &http.Client{Timeout: 10 * time.Second}
	if code, body, err := httpGet(plain, "http://"+sc.HTTP+"/healthz"); err == nil && code == http.StatusOK {
		t.Errorf("GET /healthz over plain HTTP = %d %q; want a refusal", code, body)
	}
	untrusting := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: testutil.NewCerts(t).Pool}}}
	if _, _, err := httpGet(untrusting, "https://"+sc.HTTP+"/healthz"); err == nil {
		t.Error("GET /healthz trusting another CA succeeded")
	}
}

// The sidecar warns when an API listens beyond loopback without TLS, and
// when --nats-listen exposes the embedded server beyond loopback without
// authentication (--allow-unauthenticated) or without TLS; on loopback, or
// with TLS, it does not.
func TestSecurityExposureWarnings(t *testing.T) {
	certs := testutil.NewCerts(t)
	// A hash: with a plaintext password nats-server warns too ("Plaintext
	// passwords detected").
	hash, err := bcrypt.GenerateFromPassword([]byte("nats-listen-password-1"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	password := string(hash)
	for _, tc := range []struct {
		name string
		cfg  sidecar.Config
		want []string // the warnings, by what they name
	}{
		{"loopback", sidecar.Config{NATSListen: "127.0.0.1:0"}, nil},
		{"all interfaces", sidecar.Config{GRPCAddr: ":0", HTTPAddr: "0.0.0.0:0", NATSListen: "0.0.0.0:0", AllowUnauthenticated: true},
			[]string{"gRPC API", "HTTP API", "--nats-listen exposes the embedded nats-server beyond loopback without authentication"}},
		{"all interfaces with TLS", sidecar.Config{GRPCAddr: ":0", HTTPAddr: ":0", TLSCert: certs.ServerCert, TLSKey: certs.ServerKey, AllowUnauthenticated: true},
			nil},
		{"gRPC only", sidecar.Config{GRPCAddr: ":0", HTTPAddr: "off", AllowUnauthenticated: true}, []string{"gRPC API"}},
		{"NATS with a password", sidecar.Config{NATSListen: "0.0.0.0:0", NATSListenUser: "ops", NATSListenPassword: password},
			[]string{"(--nats-listen) listens beyond loopback without TLS"}},
		{"NATS with a password and TLS", sidecar.Config{NATSListen: "0.0.0.0:0", NATSListenUser: "ops", NATSListenPassword: password,
			NATSListenTLSCert: certs.ServerCert, NATSListenTLSKey: certs.ServerKey}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs recordedLogs
			itest.Start(t, tc.cfg, itest.Logger(slog.New(&logs)))
			got := logs.warnings()
			if len(got) != len(tc.want) {
				t.Fatalf("warnings %q, want ones naming %q", got, tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %q does not name %q", got[i], w)
				}
			}
		})
	}
}

// natsServerWith starts a JetStream nats-server on a random loopback port, its
// options changed by configure, and stops it when the test ends.
func natsServerWith(t *testing.T, configure func(*server.Options)) *embedded.Server {
	t.Helper()
	s, err := embedded.Start(embedded.Config{StoreDir: t.TempDir(), Configure: configure})
	if err != nil {
		t.Fatalf("start nats-server: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// roundTrip creates a topic and an ordered subscription named after id,
// publishes one message and receives it, through c.
func roundTrip(t *testing.T, c *pubsub.Client, id string) {
	t.Helper()
	id = strings.ReplaceAll(id, " ", "-")
	mustCreateTopic(t, c, id)
	mustCreateSub(t, c, &pb.Subscription{Name: subPath(id + "-sub"), Topic: topicPath(id), EnableMessageOrdering: true})
	pub := c.Publisher(id)
	pub.EnableMessageOrdering = true
	defer pub.Stop()
	publishGo(t, pub, "hello "+id, "k")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan string, 1)
	err := c.Subscriber(id+"-sub").Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		select {
		case got <- string(m.Data):
		default:
		}
		cancel()
	})
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	select {
	case data := <-got:
		if data != "hello "+id {
			t.Fatalf("received %q, want %q", data, "hello "+id)
		}
	default:
		t.Fatal("nothing received within 20s")
	}
}

// startFails runs the sidecar with cfg and opts, expecting it not to
// start, and returns the error it ended with. It must end within 10s: long
// before the 30s the sidecar waits for a JetStream that is still starting.
func startFails(t *testing.T, cfg sidecar.Config, opts ...itest.Option) error {
	t.Helper()
	sc, err := itest.StartErr(t, cfg, append(opts, itest.ReadyTimeout(10*time.Second))...)
	switch {
	case sc != nil:
		t.Error("the sidecar started")
		sc.Stop()
	case errors.Is(err, itest.ErrNotReady):
		t.Errorf("Run did not end within 10s: %v", err)
	case errors.Is(err, itest.ErrEnded):
		t.Error("Run returned no error")
	}
	return err
}

func httpGet(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(bytes.TrimSpace(body)), err
}

// isTLSFailure tells whether err is a failed TLS handshake or a server's
// refusal of the client's certificate, which nats.go reports as the
// connection's read error after the handshake.
func isTLSFailure(err error) bool {
	return errors.Is(err, nats.ErrTLS) || (err != nil && strings.Contains(err.Error(), "tls: "))
}

// newNkeyUser makes a user nkey and writes its seed to dir/name.
func newNkeyUser(t *testing.T, dir, name string) (public, seedFile string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	public, _ = kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile = filepath.Join(dir, name)
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return public, seedFile
}

// natsOperator is an operator with a system account and an application
// account, for a server in operator mode with a memory resolver.
type natsOperator struct {
	claims          *jwt.OperatorClaims
	sysPub          string
	appKey, noJSKey nkeys.KeyPair
	accountJWTs     map[string]string
}

func newOperator(t *testing.T) *natsOperator {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	opKey, err := nkeys.CreateOperator()
	must(err)
	opPub, _ := opKey.PublicKey()
	o := &natsOperator{accountJWTs: map[string]string{}}
	account := func(name string, jetStream bool) (nkeys.KeyPair, string) {
		kp, err := nkeys.CreateAccount()
		must(err)
		pub, _ := kp.PublicKey()
		ac := jwt.NewAccountClaims(pub)
		ac.Name = name
		if jetStream {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		o.accountJWTs[pub], err = ac.Encode(opKey)
		must(err)
		return kp, pub
	}
	_, o.sysPub = account("SYS", false)
	o.appKey, _ = account("APP", true)
	o.noJSKey, _ = account("NOJS", false)
	o.claims = jwt.NewOperatorClaims(opPub)
	o.claims.SystemAccount = o.sysPub
	// The server reads the claims from the signed token, as from a file.
	opJWT, err := o.claims.Encode(opKey)
	must(err)
	o.claims, err = jwt.DecodeOperatorClaims(opJWT)
	must(err)
	return o
}

// configure puts the server in operator mode, trusting o's accounts.
func (o *natsOperator) configure(opts *server.Options) {
	r := &server.MemAccResolver{}
	for pub, token := range o.accountJWTs {
		_ = r.Store(pub, token) // a memory store does not fail
	}
	opts.TrustedOperators = []*jwt.OperatorClaims{o.claims}
	opts.AccountResolver = r
	opts.SystemAccount = o.sysPub
}

// creds writes a credentials file for a new user of the application
// account (with JetStream) or of the account without it.
func (o *natsOperator) creds(t *testing.T, dir, name string, jetStream bool) string {
	t.Helper()
	issuer := o.noJSKey
	if jetStream {
		issuer = o.appKey
	}
	uk, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	upub, _ := uk.PublicKey()
	useed, _ := uk.Seed()
	token, err := jwt.NewUserClaims(upub).Encode(issuer)
	if err != nil {
		t.Fatal(err)
	}
	file, err := jwt.FormatUserConfig(token, useed)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// recordedLogs keeps the sidecar's log records for a test to read.
type recordedLogs struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *recordedLogs) Enabled(context.Context, slog.Level) bool { return true }
func (l *recordedLogs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *recordedLogs) WithGroup(string) slog.Handler            { return l }
func (l *recordedLogs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// warnings are the messages of the WARN records logged so far.
func (l *recordedLogs) warnings() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var w []string
	for _, r := range l.records {
		if r.Level == slog.LevelWarn {
			w = append(w, r.Message)
		}
	}
	return w
}
