// Package sidecar wires the sidecar together: the NATS connection (to an
// embedded nats-server or an existing one), the broker, the Pub/Sub gRPC
// API and the HTTP API, and their orderly shutdown. cmd/sidecar parses
// flags into a Config and calls Run; tests call Run in-process.
package sidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	_ "google.golang.org/grpc/encoding/gzip" // clients may compress requests (the Go client's EnableCompression)
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/broker"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/httpapi"
	"github.com/jetorder/jetorder/internal/iam"
	"github.com/jetorder/jetorder/internal/metrics"
	"github.com/jetorder/jetorder/internal/pubsubapi"
	"github.com/jetorder/jetorder/internal/push"
	"github.com/jetorder/jetorder/internal/resources"
	"github.com/jetorder/jetorder/internal/schemaapi"
)

// Config is the sidecar's configuration; cmd/sidecar documents each field
// as a flag.
type Config struct {
	GRPCAddr string // Pub/Sub gRPC API
	HTTPAddr string // HTTP API; "" or "off" disables it
	// TLSCert and TLSKey, when set, serve both APIs over TLS.
	TLSCert, TLSKey string

	// Access control (docs/OPERATING.md, "Access control"): any of
	// TLSClientCA, AuthTokens and AuthJWKS turns it on.
	TLSClientCA      string   // CA file verifying client certificates, which name principals
	AuthTokens       string   // bearer tokens file (iam.Config.TokensFile)
	AuthJWKS         string   // JWKS file verifying bearer JWTs
	AuthJWTIssuer    string   // the iss JWTs must have; "" any
	AuthJWTAudiences []string // JWTs must name one
	IAMPolicy        string   // project-level policy file; "" every authenticated caller is admin
	// AllowUnauthenticated lets the APIs listen beyond loopback without
	// access control, and the embedded server's client port (NATSListen)
	// without authentication; otherwise Run refuses to start.
	AllowUnauthenticated bool
	// OpenEndpoints are HTTP paths served without access control, of
	// /healthz, /readyz and /metrics.
	OpenEndpoints []string

	DataDir string // the embedded server's JetStream store
	// NATSStartTimeout bounds the embedded server's start, recovering its
	// store included; default embedded.DefaultReadyTimeout.
	NATSStartTimeout time.Duration
	// Sync is when the embedded server's writes reach stable storage
	// before callers hear of them: embedded.SyncGroup ("" means it),
	// SyncAlways or SyncLazy (docs/RELIABILITY.md, "Power cuts").
	Sync       embedded.SyncPolicy
	NATSListen string // also expose the embedded server's client port
	// Authentication and TLS of that port (docs/OPERATING.md, "The
	// embedded server's client port"): a user and password (or the password's bcrypt hash),
	// client certificates verified against NATSListenTLSClientCA, or both;
	// either turns authentication on. Beyond loopback Run refuses a port
	// without it, unless AllowUnauthenticated. The sidecar's own
	// connection is in-process and needs none of them.
	NATSListenUser, NATSListenPassword                         string
	NATSListenTLSCert, NATSListenTLSKey, NATSListenTLSClientCA string // files

	NATSURL string // use this NATS server or cluster instead

	// Credentials and TLS for NATSURL.
	NATSCreds, NATSNKey                string // files
	NATSUser, NATSPassword, NATSToken  string
	NATSTLSCA, NATSTLSCert, NATSTLSKey string // files

	// Name names this sidecar to the others on the same JetStream (the
	// status page's partition holders) and in its metrics (the sidecar
	// label); "" means the host name and the gRPC port, host:port.
	Name string

	Project  string // the HTTP API's project when a route names none
	Replicas int    // of the streams and buckets the sidecar creates

	// The CloudEvents webhook validation handshake of the HTTP API:
	// httpapi.Config's fields of the same names.
	WebhookAllowedOrigins []string
	WebhookAllowedRate    int

	// Delivery is the delivery mode of ordered subscriptions created
	// without a jetorder-delivery label.
	Delivery adapter.DeliveryMode
	// KeyStreams is the key stream count of topics created without a
	// jetorder-key-streams label (adapter.TopicConfig.KeyStreams).
	KeyStreams int
	// Ordering is when a key's next message goes to a client on ordered
	// subscriptions without a jetorder-ordering label.
	Ordering pubsubapi.Ordering

	MaxOutstandingMessages int // per subscription, held in the sidecar
	// PushAllow is the allow-list of push endpoints (push.ParseAllowList):
	// "" means push.DefaultAllow, loopback only; "off" disables push
	// subscriptions.
	PushAllow string
	// PushMaxOutstanding bounds the push requests in flight per
	// subscription, for ordering keys and unkeyed messages each.
	PushMaxOutstanding int
	MaxStreams         int // open StreamingPull streams
	// ShutdownTimeout bounds the whole shutdown (see Run): clients have
	// the first three quarters of it to settle the messages they hold,
	// before the rest are handed back; the last quarter is for handing
	// back, flushing publishes and closing NATS. Default 5s.
	ShutdownTimeout time.Duration

	// ExpirationCheck and ExpirationClock are for tests, with no flag:
	// how often the sidecar looks for subscriptions idle past their
	// expiration policy's ttl (default pubsubapi.DefaultExpirationCheck),
	// and the clock it measures idleness by (default time.Now), which a
	// test moves on by a day instead of waiting one.
	ExpirationCheck time.Duration
	ExpirationClock func() time.Time

	// Resources is a file of topics, subscriptions and schemas
	// (internal/resources) that Run creates or brings up to date before
	// it serves; "" none.
	Resources string
}

// Listening is where a started sidecar serves.
type Listening struct {
	GRPC, HTTP, NATS string // NATS is "" without a client port
}

// Run serves until ctx ends, then shuts down (see shutdown): within
// ShutdownTimeout of ctx's end, clients settle what they hold, the rest is
// handed back, the APIs stop, publishes are flushed and NATS and the
// embedded server close. ready, if not nil, is called once everything
// listens, after the resources file (Config.Resources), if any, is
// applied: nothing is served before. Run returns nil after a shutdown that ctx asked for, or the
// error that ended it (a server that failed, or a setup that could not
// start).
func Run(ctx context.Context, cfg Config, log *slog.Logger, ready func(Listening)) error {
	s, err := setup(ctx, cfg, log)
	if err != nil || s == nil {
		return err // s is nil when ctx ended while starting
	}
	runErr := s.serve(ctx, ready)
	s.shutdown()
	return runErr
}

// sidecar is a set-up sidecar: what setup built, serve runs and shutdown
// stops.
type sidecar struct {
	cfg   Config
	log   *slog.Logger
	where Listening

	srv *embedded.Server // nil when cfg.NATSURL names a server
	nc  *nats.Conn
	js  jetstream.JetStream
	b   *broker.Broker
	api *pubsubapi.Server

	schemas  *schemaapi.Server
	guard    *iam.Guard     // nil without access control
	policies *iam.LazyStore // resource policies; opened at setup with access control

	gs      *grpc.Server
	hs      *health.Server
	gl      net.Listener
	httpSrv *http.Server // nil with the HTTP API off
	hl      net.Listener
	tls     bool

	// Started by serve, stopped by shutdown.
	stopHealth context.CancelFunc // ends the health watch and stamp recovery
	healthDone chan struct{}
	recovered  chan struct{} // closed when stamp recovery ended
	grpcDone   chan error
	httpDone   chan error
}

// setup connects to NATS (starting the embedded server unless cfg names
// one), waits for JetStream, listens on the API addresses and builds the
// servers; nothing is served yet. On failure it closes what it opened.
// It returns nil, nil when ctx ends while it waits for JetStream.
func setup(ctx context.Context, cfg Config, log *slog.Logger) (*sidecar, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	var pushAllow *push.AllowList
	var err error
	if cfg.PushAllow != "off" {
		allow := cfg.PushAllow
		if allow == "" {
			allow = push.DefaultAllow
		}
		if pushAllow, err = push.ParseAllowList(allow); err != nil {
			return nil, err
		}
	}
	if err := cfg.CheckNATSListen(); err != nil {
		return nil, err
	}
	if err := checkNATSExposure(ctx, cfg); err != nil {
		return nil, err
	}
	var declared *resources.File
	if cfg.Resources != "" { // read first: a file that is not valid starts nothing
		if declared, err = resources.Load(cfg.Resources); err != nil {
			return nil, fmt.Errorf("--resources: %w", err)
		}
	}
	s := &sidecar{cfg: cfg, log: log}
	if s.nc, s.srv, err = connect(cfg, log); err != nil {
		return nil, err
	}
	built := false
	defer func() {
		if !built { // failed, or asked to stop: close what is open
			for _, l := range []net.Listener{s.gl, s.hl} {
				if l != nil {
					_ = l.Close()
				}
			}
			if s.policies != nil {
				s.policies.Close()
			}
			s.closeNATS()
		}
	}()
	if s.srv != nil && cfg.NATSListen != "" {
		s.where.NATS = s.srv.ClientURL()
	}
	if s.js, err = jetstream.New(s.nc); err != nil {
		return nil, err
	}
	if err := waitJetStream(ctx, s.js); err != nil {
		if ctx.Err() != nil {
			return nil, nil // asked to stop while starting
		}
		return nil, err
	}
	// Before anything is written: a newer layout is refused untouched.
	if err := ensureLayout(ctx, s.js, max(cfg.Replicas, 1), log); err != nil {
		if ctx.Err() != nil {
			return nil, nil
		}
		return nil, err
	}

	var tlsConf *tls.Config
	if cfg.TLSCert != "" || cfg.TLSKey != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		s.tls = true
		if cfg.TLSClientCA != "" {
			pool, err := loadCA(cfg.TLSClientCA)
			if err != nil {
				return nil, fmt.Errorf("--tls-client-ca: %w", err)
			}
			// If given: a caller may authenticate with a token instead,
			// and /healthz needs no certificate.
			tlsConf.ClientCAs, tlsConf.ClientAuth = pool, tls.VerifyClientCertIfGiven
		}
	}
	if s.gl, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
		return nil, fmt.Errorf("--grpc-addr: %w", err)
	}
	s.where.GRPC = s.gl.Addr().String()
	if cfg.HTTPAddr != "" && cfg.HTTPAddr != "off" {
		if s.hl, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return nil, fmt.Errorf("--http-addr: %w", err)
		}
		s.where.HTTP = s.hl.Addr().String()
	}

	if err := s.checkExposure(); err != nil {
		return nil, err
	}
	if err := s.setupAccess(ctx); err != nil {
		return nil, err
	}

	if s.cfg.Name == "" {
		s.cfg.Name = defaultName(s.gl.Addr())
	}
	syncDesc, syncRisk := s.describeSync()
	reg := metrics.NewFor(s.cfg.Name)
	// A client's Close waits no longer than the whole shutdown may take.
	aopts := []adapter.Option{adapter.WithLogger(log), adapter.WithReplicas(max(cfg.Replicas, 1)),
		adapter.WithCloseTimeout(cfg.ShutdownTimeout), adapter.WithName(s.cfg.Name)}
	// Under group commit, acknowledgements wait for the embedded server's
	// sync; under the other policies there is nothing to wait for.
	var durable func(context.Context) error
	if s.srv != nil && s.srv.SyncPolicy() == embedded.SyncGroup {
		durable = s.srv.Sync
		aopts = append(aopts, adapter.WithDurableSync(durable))
	}
	s.b = broker.New(s.nc, log, reg, aopts...)
	s.b.BucketReplicas = max(cfg.Replicas, 1)
	s.b.Durable = durable
	s.schemas = schemaapi.New(s.b.Conn(), max(cfg.Replicas, 1), log)
	schemas := s.schemas
	s.api = pubsubapi.New(s.b, pubsubapi.Config{
		MaxOutstandingMessages: cfg.MaxOutstandingMessages,
		MaxStreams:             cfg.MaxStreams,
		Delivery:               cfg.Delivery,
		KeyStreams:             cfg.KeyStreams,
		Ordering:               cfg.Ordering,
		Replicas:               max(cfg.Replicas, 1),
		Logger:                 log,
		Schemas:                schemas, // Publish validates against them
		PushAllow:              pushAllow,
		PushMaxOutstanding:     cfg.PushMaxOutstanding,
		EmbeddedNATS:           s.srv != nil,
		Sync:                   syncDesc,
		SyncRisk:               syncRisk,
		ExpirationCheck:        cfg.ExpirationCheck,
		Now:                    cfg.ExpirationClock,
	})
	// The gauges of /metrics come from the status, as the status page's
	// figures do.
	if err := reg.RegisterStatus(s.api.StatusForMetrics); err != nil {
		s.api.Close()
		return nil, err
	}

	gopts := []grpc.ServerOption{
		// Pub/Sub accepts 10 MB publish requests; leave room for framing.
		grpc.MaxRecvMsgSize(maxGRPCMessage),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(logUnary(log)),
		grpc.ChainStreamInterceptor(logStream(log)),
	}
	// The IAMPolicy service: with access control the guard's, which
	// enforces the policies; without, one that keeps them and enforces
	// nothing, as every call is allowed.
	var policies *iam.Service
	if s.guard != nil { // after the log, which then shows refusals too
		gopts = append(gopts, grpc.ChainUnaryInterceptor(s.guard.UnaryInterceptor()),
			grpc.ChainStreamInterceptor(s.guard.StreamInterceptor()))
		policies = s.guard.Service()
	} else {
		policies = iam.OpenService(s.policies, s.exists, log)
	}
	// A resource deleted loses its policy.
	gopts = append(gopts, grpc.ChainUnaryInterceptor(policies.UnaryInterceptor()))
	if durable != nil {
		gopts = append(gopts, grpc.ChainUnaryInterceptor(syncUnary(durable)))
	}
	if tlsConf != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tlsConf)))
	}
	s.gs = grpc.NewServer(gopts...)
	s.api.Register(s.gs)
	schemas.Register(s.gs)
	policies.Register(s.gs)
	// Health: SERVING while NATS and JetStream answer (they do by now),
	// NOT_SERVING while they do not, and from the start of shutdown.
	s.hs = health.NewServer()
	healthpb.RegisterHealthServer(s.gs, s.hs)
	reflection.Register(s.gs)

	if s.hl != nil {
		var api http.Handler = httpapi.New(httpapi.Config{
			Broker:         s.b,
			DefaultProject: cfg.Project,
			Ready:          s.ready,
			Logger:         log,
			PubSub:         s.api, // the Pub/Sub REST API, over the gRPC server's methods
			Schemas:        schemas,
			Status:         s.api.Status,
			Guard:          s.guard,
			IAM:            policies,
			OpenPaths:      cfg.OpenEndpoints,

			WebhookAllowedOrigins: cfg.WebhookAllowedOrigins,
			WebhookAllowedRate:    cfg.WebhookAllowedRate,
		})
		if durable != nil {
			api = syncHTTP(durable, api)
		}
		s.httpSrv = &http.Server{
			Handler:           logRequests(log, api),
			ReadHeaderTimeout: 10 * time.Second,
			TLSConfig:         tlsConf,
			// Failed handshakes and the like: to our log, not the standard one.
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
	}
	if declared != nil {
		if err := s.applyResources(ctx, declared, durable); err != nil {
			s.api.Close()
			if ctx.Err() != nil {
				return nil, nil
			}
			return nil, err
		}
	}
	built = true
	return s, nil
}

// The servers Apply goes through.
var (
	_ resources.PubSub  = (*pubsubapi.Server)(nil)
	_ resources.Schemas = (*schemaapi.Server)(nil)
)

// applyResources applies the resources file through the API's servers,
// in process: nothing is served yet, so no client (and no /readyz) sees
// the sidecar before the declared resources exist; no caller's access
// control applies. Under group commit it waits for the sync, as the API
// would before answering.
func (s *sidecar) applyResources(ctx context.Context, f *resources.File, durable func(context.Context) error) error {
	start := time.Now()
	report, err := f.Apply(ctx, s.api, s.schemas)
	for _, o := range report {
		switch {
		case o.Created:
			s.log.Info("resource created", "name", o.Name)
		case len(o.Updated) > 0:
			s.log.Info("resource updated", "name", o.Name, "fields", strings.Join(o.Updated, ","))
		}
	}
	if err != nil {
		return fmt.Errorf("--resources: %w", err)
	}
	if durable != nil {
		if err := durable(ctx); err != nil {
			return fmt.Errorf("--resources: applied, but not confirmed on stable storage: %w", err)
		}
	}
	created, updated, unchanged := report.Counts()
	s.log.Info("resources applied", "file", f.Path, "created", created, "updated", updated, "unchanged", unchanged,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}

// ready reports whether NATS and JetStream answer.
func (s *sidecar) ready(ctx context.Context) error { return checkReady(ctx, s.nc, s.js) }

// serve serves both APIs and keeps the health status current until ctx
// ends or a server fails, whose error it returns.
func (s *sidecar) serve(ctx context.Context, ready func(Listening)) error {
	hctx, stopHealth := context.WithCancel(context.Background())
	s.stopHealth, s.healthDone = stopHealth, make(chan struct{})
	go func() {
		defer close(s.healthDone)
		watchHealth(hctx, s.hs, s.ready)
	}()
	// DIDComm stamped messages a crash left between reservation and store.
	s.recovered = make(chan struct{})
	go func() {
		defer close(s.recovered)
		s.b.RecoverStampsLoop(hctx)
	}()
	s.grpcDone = make(chan error, 1)
	go func() { s.grpcDone <- s.gs.Serve(s.gl) }()
	s.httpDone = make(chan error, 1)
	if s.httpSrv != nil {
		go func() {
			if s.tls {
				s.httpDone <- s.httpSrv.ServeTLS(s.hl, "", "")
			} else {
				s.httpDone <- s.httpSrv.Serve(s.hl)
			}
		}()
	}

	attrs := []any{"grpc", s.where.GRPC, "http", orOff(s.where.HTTP), "tls", s.tls, "name", s.cfg.Name}
	if s.srv != nil {
		attrs = append(attrs, "nats", "embedded", "data_dir", s.cfg.DataDir, "nats_listen", orOff(s.where.NATS))
		if s.where.NATS != "" {
			attrs = append(attrs, "nats_listen_auth", describeNATSListenAuth(s.cfg))
		}
		attrs = append(attrs, "sync", s.srv.SyncPolicy())
	} else {
		attrs = append(attrs, "nats", redactURLs(s.nc.ConnectedUrl()))
	}
	s.log.Info("jetorder sidecar listening", attrs...)
	// Credentials travel in the clear without TLS, and without access
	// control anyone may do anything: say so when others can reach the
	// ports.
	if !s.tls && beyondLoopback(s.gl.Addr()) {
		s.log.Warn("the gRPC API listens beyond loopback without TLS", "grpc", s.where.GRPC)
	}
	if !s.tls && s.hl != nil && beyondLoopback(s.hl.Addr()) {
		s.log.Warn("the HTTP API listens beyond loopback without TLS", "http", s.where.HTTP)
	}
	if s.srv != nil && s.where.NATS != "" && beyondLoopback(s.srv.Addr()) {
		switch {
		case !s.cfg.natsListenAuth(): // --allow-unauthenticated
			s.log.Warn("--nats-listen exposes the embedded nats-server beyond loopback without authentication", "nats_listen", s.where.NATS)
		case s.cfg.NATSListenTLSCert == "":
			s.log.Warn("the embedded nats-server's client port (--nats-listen) listens beyond loopback without TLS", "nats_listen", s.where.NATS)
		}
	}
	if ready != nil {
		ready(s.where)
	}

	select {
	case <-ctx.Done():
		return nil
	case err := <-s.grpcDone:
		s.grpcDone <- err // for shutdown, which waits for Serve to return
		return fmt.Errorf("gRPC server: %w", err)
	case err := <-s.httpDone:
		s.httpDone <- err
		return fmt.Errorf("HTTP server: %w", err)
	}
}

// settleShare is the part of ShutdownTimeout that clients have to settle
// the messages they hold; the rest is for handing back what they still
// hold, finishing requests in flight, flushing publishes and closing NATS.
const settleShare = 0.75

// shutdown stops what serve started, in order, within one deadline:
// ShutdownTimeout from its start. Each step that waits for others (clients,
// requests in flight, the NATS server) waits at most until the deadline;
// then it is cut short and the next step runs.
//
//  1. Refuse new work: the health status goes NOT_SERVING, so load
//     balancers stop sending work.
//  2. Let clients settle: the Pub/Sub API attaches no new streams or pulls
//     and hands out no more messages, but still takes acks (over gRPC and
//     HTTP); clients have until settleShare of the timeout to ack or nack
//     what they hold. Publishes are still taken.
//  3. Hand back and end streams: messages still with clients or waiting
//     for one go back (they are redelivered, in order, to whoever
//     receives next), push requests in flight are abandoned, streams end
//     with UNAVAILABLE, and the dispatchers' Receive calls end.
//  4. Stop the APIs, HTTP and gRPC at once: no new requests; those in
//     flight (publishes) finish, or at the deadline their connections
//     are closed.
//  5. Close the adapter clients: every topic's queued publishes are
//     flushed, then each client closes.
//  6. Drain NATS: what the connection holds is delivered or sent; at the
//     deadline it is closed.
//  7. Stop the embedded nats-server, if there is one (not bounded: it
//     writes its store).
//
// Steps 3 and 5 cannot be cut short: at the deadline they go on in the
// background while the next step runs, and closing NATS ends them.
//
// Before the deadline was shared, the APIs stopped (the HTTP API between
// steps 2 and 3) before messages were handed back. Under one deadline that
// would let a request in flight use up the time for handing back, and the
// messages clients held would then wait out their ack deadlines, and
// their keys with them; handing back needs neither API.
func (s *sidecar) shutdown() {
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(s.cfg.ShutdownTimeout))
	defer cancel()
	s.log.Info("shutting down", "deadline", s.cfg.ShutdownTimeout)

	// 1. Refuse new work.
	s.stopHealth()
	<-s.healthDone
	<-s.recovered
	s.hs.Shutdown()

	// 2. Let clients settle.
	sctx, cancelSettle := context.WithDeadline(ctx, start.Add(time.Duration(settleShare*float64(s.cfg.ShutdownTimeout))))
	s.api.Drain(sctx)
	cancelSettle()

	// 3. Hand back and end streams.
	s.within(ctx, "hand back messages and end streams", s.api.Close, nil)

	// 4. Stop the APIs.
	var apis sync.WaitGroup
	if s.httpSrv != nil {
		apis.Go(func() {
			if err := s.httpSrv.Shutdown(ctx); err != nil {
				s.log.Warn("shutdown: HTTP requests in flight at the deadline; closing their connections", "err", err)
				_ = s.httpSrv.Close()
			}
			<-s.httpDone
		})
	}
	apis.Go(func() {
		s.within(ctx, "stop the gRPC API", s.gs.GracefulStop, s.gs.Stop)
		<-s.grpcDone
	})
	apis.Wait()
	if s.policies != nil {
		s.policies.Close()
	}

	// 5. Close the adapter clients.
	s.within(ctx, "flush publishes and close the adapter clients", s.b.Close, nil)

	// 6. Drain NATS.
	closed := s.nc.StatusChanged(nats.CLOSED)
	if err := s.nc.Drain(); err == nil {
		select {
		case <-closed:
		case <-ctx.Done():
			s.log.Warn("shutdown: NATS connection not drained by the deadline; closing it")
		}
	} else if !errors.Is(err, nats.ErrConnectionClosed) {
		s.log.Warn("drain NATS connection", "err", err)
	}
	s.closeNATS() // 7. and the embedded server
	s.log.Info("stopped", "took", time.Since(start).Round(time.Millisecond))
}

// within runs step until it returns or ctx ends. Then, if force is not
// nil, it calls force, which makes step return, and waits for step;
// without one, step goes on in the background.
func (s *sidecar) within(ctx context.Context, name string, step, force func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		step()
	}()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	if force == nil {
		s.log.Warn("shutdown: step not finished by the deadline; going on", "step", name)
		return
	}
	s.log.Warn("shutdown: step not finished by the deadline; cutting it short", "step", name)
	force()
	<-done
}

// closeNATS closes the NATS connection and stops the embedded server.
func (s *sidecar) closeNATS() {
	if s.nc != nil {
		s.nc.Close()
	}
	if s.srv != nil {
		s.srv.Shutdown()
		s.srv.WaitForShutdown()
		s.log.Info("embedded nats-server stopped")
	}
}

// connect starts the embedded server, unless cfg names an external one,
// and connects to it.
func connect(cfg Config, log *slog.Logger) (*nats.Conn, *embedded.Server, error) {
	opts := []nats.Option{
		nats.Name("jetorder-sidecar"),
		nats.MaxReconnects(-1),
		// Every 250 ms rather than nats.go's 2 s: after a NATS server
		// restart, delivery waits for the reconnect (docs/RELIABILITY.md).
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1), // the adapter requires it: see adapter.NewClient
		// A server that stops answering (paused, or its host hung) is left
		// for another after about 15 s, not nats.go's 4 minutes.
		nats.PingInterval(5 * time.Second),
		nats.MaxPingsOutstanding(3),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: our own close at shutdown
				log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "url", redactURLs(c.ConnectedUrl())) }),
		// Asynchronous errors, such as permission violations and slow
		// consumers, go to our log instead of nats.go's default, stderr.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if sub != nil {
				log.Warn("NATS error", "subject", sub.Subject, "err", err)
			} else {
				log.Warn("NATS error", "err", err)
			}
		}),
	}
	if cfg.NATSURL == "" {
		configure, own, err := natsListenSecurity(cfg)
		if err != nil {
			return nil, nil, err
		}
		ecfg := embedded.Config{StoreDir: cfg.DataDir, NoListen: cfg.NATSListen == "", Logger: log, Sync: cfg.Sync, Configure: configure,
			ReadyTimeout: cfg.NATSStartTimeout}
		if cfg.NATSListen != "" {
			host, port, err := net.SplitHostPort(cfg.NATSListen)
			if err != nil {
				return nil, nil, fmt.Errorf("--nats-listen %q: %w", cfg.NATSListen, err)
			}
			if ecfg.Port, err = strconv.Atoi(port); err != nil {
				return nil, nil, fmt.Errorf("--nats-listen %q: bad port", cfg.NATSListen)
			}
			if ecfg.Port == 0 {
				ecfg.Port = -1
			}
			ecfg.Host = host
		}
		srv, err := embedded.Start(ecfg)
		switch {
		case errors.Is(err, embedded.ErrStoreDir), errors.Is(err, embedded.ErrStoreLocked):
			return nil, nil, fmt.Errorf("--data-dir %s: %w", cfg.DataDir, err)
		case errors.Is(err, embedded.ErrPortInUse):
			return nil, nil, fmt.Errorf("--nats-listen %s: %w", cfg.NATSListen, err)
		case err != nil:
			return nil, nil, err
		}
		nc, err := nats.Connect("", append(append(opts, own...), nats.InProcessServer(srv))...)
		if err != nil {
			srv.Shutdown()
			return nil, nil, fmt.Errorf("connect to the embedded server: %w", err)
		}
		return nc, srv, nil
	}
	if cfg.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(cfg.NATSCreds))
	}
	if cfg.NATSNKey != "" {
		o, err := nats.NkeyOptionFromSeed(cfg.NATSNKey)
		if err != nil {
			return nil, nil, fmt.Errorf("--nats-nkey: %w", err)
		}
		opts = append(opts, o)
	}
	if cfg.NATSUser != "" || cfg.NATSPassword != "" {
		opts = append(opts, nats.UserInfo(cfg.NATSUser, cfg.NATSPassword))
	}
	if cfg.NATSToken != "" {
		opts = append(opts, nats.Token(cfg.NATSToken))
	}
	if cfg.NATSTLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.NATSTLSCA))
	}
	if cfg.NATSTLSCert != "" || cfg.NATSTLSKey != "" {
		opts = append(opts, nats.ClientCert(cfg.NATSTLSCert, cfg.NATSTLSKey))
	}
	// The URLs in the order given, not shuffled as nats.go would: the
	// first is the server this sidecar should use (the one beside it),
	// the others where it fails over to.
	opts = append(opts, nats.DontRandomize())
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", redactURLs(cfg.NATSURL), err)
	}
	return nc, nil, nil
}

// waitJetStream waits, until ctx ends, for JetStream to answer: a cluster
// may still be electing its meta leader.
func waitJetStream(ctx context.Context, js jetstream.JetStream) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return fmt.Errorf("JetStream not available: %w", err) // waiting will not change it
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("JetStream not available: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// ensureLayout makes the account's storage layout this build's
// (adapter.EnsureLayout), trying again for up to a minute while NATS
// fails; a newer layout is refused at once.
func ensureLayout(ctx context.Context, js jetstream.JetStream, replicas int, log *slog.Logger) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := adapter.EnsureLayout(ctx, js, replicas, log)
		if err == nil || errors.Is(err, adapter.ErrLayoutNewer) || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		log.Warn("storage layout check failed; trying again", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func checkReady(ctx context.Context, nc *nats.Conn, js jetstream.JetStream) error {
	if !nc.IsConnected() {
		return fmt.Errorf("NATS %s", nc.Status())
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}
	return nil
}

// maxGRPCMessage bounds a request: Pub/Sub's 10 MB publish request, with
// room for framing.
const maxGRPCMessage = 12 << 20

// healthServices are the names the health service answers for: the
// server as a whole ("") and each Pub/Sub service.
var healthServices = []string{"", "google.pubsub.v1.Publisher", "google.pubsub.v1.Subscriber", "google.pubsub.v1.SchemaService"}

// watchHealth sets the gRPC health status of healthServices from ready,
// checked every second until ctx ends.
func watchHealth(ctx context.Context, hs *health.Server, ready func(context.Context) error) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_SERVING
		if ready(ctx) != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		if ctx.Err() != nil {
			return // shutting down: Shutdown has set NOT_SERVING
		}
		for _, name := range healthServices {
			hs.SetServingStatus(name, st)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func orOff(s string) string {
	if s == "" {
		return "off"
	}
	return s
}

// redactURLs hides the password or token of each URL in a comma-separated
// list, for logs and errors.
func redactURLs(urls string) string {
	list := strings.Split(urls, ",")
	for i, raw := range list {
		raw = strings.TrimSpace(raw)
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw // as nats.go reads it
		}
		u, err := url.Parse(raw)
		switch {
		case err != nil:
			list[i] = "(invalid URL)"
			continue
		case u.User == nil:
		case hasPassword(u.User):
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		default:
			u.User = url.User("xxxxx") // a user name alone is a token
		}
		list[i] = u.String()
	}
	return strings.Join(list, ",")
}

func hasPassword(u *url.Userinfo) bool {
	_, ok := u.Password()
	return ok
}

// beyondLoopback tells whether others than this host can reach a listener.
func beyondLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return !ok || !ta.IP.IsLoopback()
}

// defaultName is the sidecar's name without --name: the host name and the
// gRPC port, which tell apart sidecars on one host too.
func defaultName(grpc net.Addr) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "sidecar"
	}
	if ta, ok := grpc.(*net.TCPAddr); ok {
		return host + ":" + strconv.Itoa(ta.Port)
	}
	return host
}
