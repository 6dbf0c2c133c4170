// Package itest is the one harness of the integration tests: it starts the
// sidecar (in-process through sidecar.Run, or as the built binary), dials
// Google's Go client and raw gRPC connections to it, and publishes checked
// messages. A new test adds a case or an option here, not a helper of its
// own.
package itest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// Project is the Pub/Sub project of every test, and the sidecar's default
// project for HTTP routes that name none.
const Project = "test-project"

// Delivery is the delivery mode of the ordered subscriptions the tests
// create without choosing one: JETORDER_TEST_DELIVERY=per-key runs the
// shared behaviour suite against per-key delivery instead of the default,
// partitioned (make test runs it both ways).
var Delivery = adapter.DeliveryMode(os.Getenv("JETORDER_TEST_DELIVERY"))

// KeyStreams is the key stream count (adapter.TopicConfig.KeyStreams) of
// the topics the tests create without choosing one, through the library
// or a sidecar's --key-streams: JETORDER_TEST_KEY_STREAMS=8 runs them on
// topics split over 8.
var KeyStreams, _ = strconv.Atoi(os.Getenv("JETORDER_TEST_KEY_STREAMS"))

var (
	// ErrNotReady is returned by StartErr when the sidecar neither listened
	// nor ended within the ready timeout; it was then stopped.
	ErrNotReady = errors.New("itest: sidecar not ready in time")
	// ErrEnded is returned by StartErr when the sidecar ended before it
	// was ready without reporting an error (Run returned nil, or the
	// process exited 0); an error it did report is returned wrapped instead.
	ErrEnded = errors.New("itest: sidecar ended before it was ready")
)

// Sidecar is a started sidecar. Its methods are for the test goroutine.
type Sidecar struct {
	// Where it serves: host:port of the APIs, the NATS URL of the embedded
	// server's client port ("" unless cfg.NATSListen asked for one).
	GRPC, HTTP, NATS string
	ReadyAt          time.Time // when it was seen listening

	t    testing.TB
	cfg  sidecar.Config // with the defaults applied
	opts []Option
	o    options

	// in-process
	cancel  context.CancelFunc
	done    chan error
	stopped sync.Once

	// binary
	proc *Process
}

// Start starts a sidecar configured by cfg and waits until it listens,
// failing the test if it does not. Unset fields get test defaults: both
// APIs on random loopback ports, a data dir in t.TempDir(), Project,
// Delivery, a 2s shutdown timeout. It runs until the test ends (in-process:
// stopped as by SIGTERM; binary: killed) unless stopped before.
func Start(t testing.TB, cfg sidecar.Config, opts ...Option) *Sidecar {
	t.Helper()
	s, err := StartErr(t, cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// StartErr is Start for a sidecar that may not start: instead of failing
// the test it returns ErrNotReady, ErrEnded or the error the sidecar ended
// with (wrapped, so errors.Is sees its cause; a binary's with its log).
// Only a sidecar that could not be launched at all fails the test.
func StartErr(t testing.TB, cfg sidecar.Config, opts ...Option) (*Sidecar, error) {
	t.Helper()
	o := options{log: Log()}
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		t.Fatalf("itest.Start: %v", err)
	}
	if o.access != nil {
		o.tls = &o.access.Certs
		cfg.TLSClientCA = o.access.Certs.CA
		cfg.AuthTokens = cmp.Or(cfg.AuthTokens, o.access.TokensFile)
		cfg.IAMPolicy = cmp.Or(cfg.IAMPolicy, o.access.PolicyFile) // a test's own policy wins
		if cfg.OpenEndpoints == nil {
			cfg.OpenEndpoints = []string{"/healthz", "/readyz"}
		}
	}
	if o.tls != nil {
		cfg.TLSCert, cfg.TLSKey = o.tls.ServerCert, o.tls.ServerKey
	}
	// Ports below the ephemeral range, which Restart can bind again (see
	// FreeAddr).
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = FreeAddr(t)
	}
	if cfg.HTTPAddr == "" {
		cfg.HTTPAddr = FreeAddr(t)
	}
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Project == "" {
		cfg.Project = Project
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 2 * time.Second
	}
	if cfg.Delivery == "" {
		cfg.Delivery = Delivery
	}
	if cfg.KeyStreams == 0 {
		cfg.KeyStreams = KeyStreams
	}
	s := &Sidecar{t: t, cfg: cfg, opts: opts, o: o}
	start := s.startInProcess
	if o.bin != "" {
		start = s.startBinary
	}
	if err := start(); err != nil {
		return nil, err
	}
	return s, nil
}

// Log is the tests' logger, for the in-process sidecar and the library:
// it discards, unless JETORDER_TEST_LOG=1 sends it to stderr at debug level.
func Log() *slog.Logger {
	if os.Getenv("JETORDER_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (s *Sidecar) startInProcess() error {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan error, 1)
	ready := make(chan sidecar.Listening, 1)
	go func() { s.done <- sidecar.Run(ctx, s.cfg, s.o.log, func(l sidecar.Listening) { ready <- l }) }()
	select {
	case at := <-ready:
		s.GRPC, s.HTTP, s.NATS, s.ReadyAt = at.GRPC, at.HTTP, at.NATS, time.Now()
		s.t.Cleanup(s.Stop)
		return nil
	case err := <-s.done:
		cancel()
		if err == nil {
			return ErrEnded
		}
		return fmt.Errorf("sidecar ended before it was ready: %w", err)
	case <-time.After(s.o.readyTimeout(30 * time.Second)):
		cancel()
		select {
		case err := <-s.done:
			return fmt.Errorf("%w (%v; Run then returned %w)", ErrNotReady, s.o.readyTimeout(30*time.Second), err)
		case <-time.After(30 * time.Second):
			return fmt.Errorf("%w (%v), and Run did not return within 30s of cancel", ErrNotReady, s.o.readyTimeout(30*time.Second))
		}
	}
}

// listening is the binary's log line once it serves, in the text or the
// JSON format.
var listening = regexp.MustCompile(`msg="jetorder sidecar listening" grpc=(\S+) http=(\S+)|"msg":"jetorder sidecar listening","grpc":"([^"]+)","http":"([^"]+)"`)

func (s *Sidecar) startBinary() error {
	found := make(chan []string, 1)
	s.proc = StartProcess(s.t, s.o.bin, append(flags(s.cfg), s.o.flags...), s.o.env, func(line string) {
		if m := listening.FindStringSubmatch(line); m != nil {
			if m[1] == "" { // JSON
				m[1], m[2] = m[3], m[4]
			}
			select {
			case found <- m:
			default:
			}
		}
	})
	select {
	case m := <-found:
		s.GRPC, s.HTTP, s.ReadyAt = m[1], m[2], time.Now()
		if s.cfg.NATSListen != "" {
			s.NATS = "nats://" + s.cfg.NATSListen
			if s.cfg.NATSListenTLSCert != "" {
				s.NATS = "tls://" + s.cfg.NATSListen
			}
		}
		return nil
	case <-s.proc.Exited():
		if s.proc.ExitCode() == 0 {
			return fmt.Errorf("%w:\n%s", ErrEnded, s.proc.Log())
		}
		return fmt.Errorf("sidecar exited with %d before it was ready:\n%s", s.proc.ExitCode(), s.proc.Log())
	case <-time.After(s.o.readyTimeout(60 * time.Second)):
		s.proc.Kill()
		return fmt.Errorf("%w (%v):\n%s", ErrNotReady, s.o.readyTimeout(60*time.Second), s.proc.Log())
	}
}

// flags are the command line of cmd/sidecar for cfg: one flag for each
// field that is set.
func flags(cfg sidecar.Config) []string {
	var args []string
	str := func(name, v string) {
		if v != "" {
			args = append(args, "--"+name, v)
		}
	}
	num := func(name string, v int) {
		if v != 0 {
			str(name, strconv.Itoa(v))
		}
	}
	str("grpc-addr", cfg.GRPCAddr)
	str("http-addr", cfg.HTTPAddr)
	str("tls-cert", cfg.TLSCert)
	str("tls-key", cfg.TLSKey)
	str("tls-client-ca", cfg.TLSClientCA)
	str("auth-tokens", cfg.AuthTokens)
	str("auth-jwks", cfg.AuthJWKS)
	str("auth-jwt-issuer", cfg.AuthJWTIssuer)
	str("auth-jwt-audience", strings.Join(cfg.AuthJWTAudiences, ","))
	str("iam-policy", cfg.IAMPolicy)
	if cfg.AllowUnauthenticated {
		str("allow-unauthenticated", "true")
	}
	if cfg.OpenEndpoints != nil {
		var open []string
		for _, e := range cfg.OpenEndpoints {
			open = append(open, strings.TrimPrefix(e, "/"))
		}
		args = append(args, "--open-endpoints="+strings.Join(open, ","))
	}
	str("data-dir", cfg.DataDir)
	str("sync", string(cfg.Sync))
	str("nats-listen", cfg.NATSListen)
	str("nats-listen-user", cfg.NATSListenUser)
	str("nats-listen-password", cfg.NATSListenPassword)
	str("nats-listen-tls-cert", cfg.NATSListenTLSCert)
	str("nats-listen-tls-key", cfg.NATSListenTLSKey)
	str("nats-listen-tls-client-ca", cfg.NATSListenTLSClientCA)
	str("nats-url", cfg.NATSURL)
	str("nats-creds", cfg.NATSCreds)
	str("nats-nkey", cfg.NATSNKey)
	str("nats-user", cfg.NATSUser)
	str("nats-password", cfg.NATSPassword)
	str("nats-token", cfg.NATSToken)
	str("nats-tls-ca", cfg.NATSTLSCA)
	str("nats-tls-cert", cfg.NATSTLSCert)
	str("nats-tls-key", cfg.NATSTLSKey)
	str("project", cfg.Project)
	str("name", cfg.Name)
	num("replicas", cfg.Replicas)
	str("webhook-allowed-origins", strings.Join(cfg.WebhookAllowedOrigins, ","))
	num("webhook-allowed-rate", cfg.WebhookAllowedRate)
	str("delivery", string(cfg.Delivery))
	num("key-streams", cfg.KeyStreams)
	str("ordering", string(cfg.Ordering))
	num("max-outstanding-messages", cfg.MaxOutstandingMessages)
	str("push-allow", cfg.PushAllow)
	num("push-max-outstanding", cfg.PushMaxOutstanding)
	num("max-streams", cfg.MaxStreams)
	if cfg.ShutdownTimeout != 0 {
		str("shutdown-timeout", cfg.ShutdownTimeout.String())
	}
	str("resources", cfg.Resources)
	return args
}

// Stop shuts the sidecar down as SIGTERM does and waits for it; it fails
// the test unless the sidecar ends cleanly within 30s. Stopping again does
// nothing.
func (s *Sidecar) Stop() {
	s.t.Helper()
	if s.proc != nil {
		s.stopped.Do(func() {
			if err := s.proc.Terminate(30 * time.Second); err != nil {
				s.t.Errorf("sidecar: %v:\n%s", err, s.proc.Log())
			}
		})
		return
	}
	s.stopped.Do(func() {
		s.cancel()
		select {
		case err := <-s.done:
			if err != nil {
				s.t.Errorf("sidecar: %v", err)
			}
		case <-time.After(30 * time.Second):
			s.t.Error("sidecar did not stop within 30s")
		}
	})
}

// Kill sends the binary SIGKILL and waits until it is gone. An in-process
// sidecar cannot be killed: the test fails.
func (s *Sidecar) Kill() {
	s.t.Helper()
	if s.proc == nil {
		s.t.Fatal("itest: Kill needs a sidecar started with Binary")
	}
	s.stopped.Do(s.proc.Kill)
}

// Signal sends the binary sig (SIGSTOP, SIGCONT). An in-process sidecar
// cannot be signalled: the test fails.
func (s *Sidecar) Signal(sig os.Signal) {
	s.t.Helper()
	if s.proc == nil {
		s.t.Fatal("itest: Signal needs a sidecar started with Binary")
	}
	s.proc.Signal(sig)
}

// Restart starts the sidecar again with the same configuration and
// options, on the same data dir and the addresses it listened on (its
// clients reconnect to it), stopping it first as Stop does if it still
// runs. The returned Sidecar replaces s.
func (s *Sidecar) Restart() *Sidecar {
	s.t.Helper()
	s.Stop()
	cfg := s.cfg
	cfg.GRPCAddr, cfg.HTTPAddr = s.GRPC, s.HTTP
	if s.NATS != "" {
		if u, err := url.Parse(s.NATS); err == nil {
			cfg.NATSListen = u.Host
		}
	}
	return Start(s.t, cfg, s.opts...)
}

// Log is what the binary wrote to stderr so far; "" in-process, whose log
// goes to the Logger option.
func (s *Sidecar) Log() string {
	if s.proc == nil {
		return ""
	}
	return s.proc.Log()
}

// Metrics scrapes the sidecar's /metrics (plain HTTP).
func (s *Sidecar) Metrics() testutil.Metrics {
	s.t.Helper()
	return testutil.Scrape(s.t, "http://"+s.HTTP+"/metrics")
}

// Option changes how Start runs the sidecar; what the sidecar does is
// its sidecar.Config.
type Option func(*options)

type options struct {
	bin     string
	flags   []string
	env     []string
	log     *slog.Logger
	tls     *testutil.Certs
	access  *Access
	timeout time.Duration
}

func (o options) validate() error {
	var err error
	if o.bin == "" && len(o.flags) > 0 {
		err = errors.Join(err, errors.New("Flags need Binary"))
	}
	if o.bin == "" && len(o.env) > 0 {
		err = errors.Join(err, errors.New("Env needs Binary"))
	}
	return err
}

func (o options) readyTimeout(def time.Duration) time.Duration {
	if o.timeout > 0 {
		return o.timeout
	}
	return def
}

// Binary runs the sidecar as the program bin (BuildSidecar), its
// configuration as flags, instead of in-process. Its stderr is kept (Log);
// a data race it reports fails the test.
func Binary(bin string) Option { return func(o *options) { o.bin = bin } }

// Flags adds command-line flags after the configuration's (Binary only),
// for what sidecar.Config does not hold, such as --log-level.
func Flags(flags ...string) Option {
	return func(o *options) { o.flags = append(o.flags, flags...) }
}

// Env adds NAME=value pairs to the binary's environment (Binary only).
func Env(env ...string) Option { return func(o *options) { o.env = append(o.env, env...) } }

// Logger receives the in-process sidecar's log instead of Log.
func Logger(log *slog.Logger) Option { return func(o *options) { o.log = log } }

// TLS serves both APIs with the server certificate of certs, and makes
// the sidecar's GoClient and Conn trust their CA.
func TLS(certs testutil.Certs) Option { return func(o *options) { o.tls = &certs } }

// WithAccess turns access control on, as a configures it: TLS with its
// certificates (client certificates verified by its CA), its tokens and
// its project policy; /healthz and /readyz stay open.
func WithAccess(a *Access) Option { return func(o *options) { o.access = a } }

// ReadyTimeout bounds the wait for the sidecar to listen: default 30s
// in-process, 60s for a binary.
func ReadyTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }
