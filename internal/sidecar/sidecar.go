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
	"strconv"
	"strings"
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
	"github.com/jetorder/jetorder/internal/metrics"
	"github.com/jetorder/jetorder/internal/pubsubapi"
	"github.com/jetorder/jetorder/internal/push"
)

// Config is the sidecar's configuration; cmd/sidecar documents each field
// as a flag.
type Config struct {
	GRPCAddr string // Pub/Sub gRPC API
	HTTPAddr string // HTTP API; "" or "off" disables it
	// TLSCert and TLSKey, when set, serve both APIs over TLS.
	TLSCert, TLSKey string

	DataDir    string // the embedded server's JetStream store
	NATSListen string // also expose the embedded server's client port
	NATSURL    string // use this NATS server or cluster instead

	// Credentials and TLS for NATSURL.
	NATSCreds, NATSNKey                string // files
	NATSUser, NATSPassword, NATSToken  string
	NATSTLSCA, NATSTLSCert, NATSTLSKey string // files

	Project  string // the HTTP API's project when a route names none
	Replicas int    // of the streams and buckets the sidecar creates

	// The CloudEvents webhook validation handshake of the HTTP API:
	// httpapi.Config's fields of the same names.
	WebhookAllowedOrigins []string
	WebhookAllowedRate    int

	// Delivery is the delivery mode of ordered subscriptions created
	// without a jetorder-delivery label.
	Delivery adapter.DeliveryMode

	MaxOutstandingMessages int // per subscription, held in the sidecar
	// PushAllow is the allow-list of push endpoints (push.ParseAllowList):
	// "" means push.DefaultAllow, loopback only; "off" disables push
	// subscriptions.
	PushAllow string
	// PushMaxOutstanding bounds the push requests in flight per
	// subscription, for ordering keys and unkeyed messages each.
	PushMaxOutstanding int
	MaxStreams         int // open StreamingPull streams
	// ShutdownTimeout bounds how long shutdown waits for clients to settle
	// the messages they hold before handing them back. Default 5s.
	ShutdownTimeout time.Duration
}

// Listening is where a started sidecar serves.
type Listening struct {
	GRPC, HTTP, NATS string // NATS is "" without a client port
}

// Run serves until ctx ends, then shuts down in order: stop handing out
// messages, wait up to ShutdownTimeout for clients to settle what they
// hold, stop the APIs, flush publishes, close NATS and the embedded
// server. ready, if not nil, is called once everything listens.
func Run(ctx context.Context, cfg Config, log *slog.Logger, ready func(Listening)) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	var where Listening
	var pushAllow *push.AllowList
	if cfg.PushAllow != "off" {
		allow := cfg.PushAllow
		if allow == "" {
			allow = push.DefaultAllow
		}
		var err error
		if pushAllow, err = push.ParseAllowList(allow); err != nil {
			return err
		}
	}
	nc, srv, err := connect(cfg, log)
	if err != nil {
		return err
	}
	if srv != nil {
		defer func() {
			srv.Shutdown()
			srv.WaitForShutdown()
			log.Info("embedded nats-server stopped")
		}()
		if cfg.NATSListen != "" {
			where.NATS = srv.ClientURL()
		}
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := waitJetStream(ctx, js); err != nil {
		if ctx.Err() != nil {
			return nil // asked to stop while starting
		}
		return err
	}

	reg := &metrics.Registry{}
	b := broker.New(nc, log, reg, adapter.WithLogger(log), adapter.WithReplicas(max(cfg.Replicas, 1)))
	b.BucketReplicas = max(cfg.Replicas, 1)
	reg.GaugeFunc("jetorder_live_consumers", "JetStream consumers in the account (per-key consumers follow the active keys).",
		func() (float64, bool) {
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			info, err := js.AccountInfo(cctx)
			if err != nil {
				return 0, false
			}
			return float64(info.Consumers), true
		})
	schemas := pubsubapi.NewSchemaServer(b.Conn(), max(cfg.Replicas, 1), log)
	api := pubsubapi.New(b, pubsubapi.Config{
		MaxOutstandingMessages: cfg.MaxOutstandingMessages,
		MaxStreams:             cfg.MaxStreams,
		Delivery:               cfg.Delivery,
		Replicas:               max(cfg.Replicas, 1),
		Logger:                 log,
		Schemas:                schemas, // Publish validates against them
		PushAllow:              pushAllow,
		PushMaxOutstanding:     cfg.PushMaxOutstanding,
	})

	var tlsConf *tls.Config
	if cfg.TLSCert != "" || cfg.TLSKey != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}

	gopts := []grpc.ServerOption{
		// Pub/Sub accepts 10 MB publish requests; leave room for framing.
		grpc.MaxRecvMsgSize(maxGRPCMessage),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if tlsConf != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tlsConf)))
	}
	gs := grpc.NewServer(gopts...)
	api.Register(gs)
	schemas.Register(gs)
	// Health: SERVING while NATS and JetStream answer (they do by now),
	// NOT_SERVING while they do not, and from the start of shutdown.
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	healthCtx, stopHealth := context.WithCancel(ctx)
	defer stopHealth()
	go watchHealth(healthCtx, hs, func(ctx context.Context) error { return checkReady(ctx, nc, js) })
	gl, err := net.Listen("tcp", cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	where.GRPC = gl.Addr().String()
	grpcDone := make(chan error, 1)
	go func() { grpcDone <- gs.Serve(gl) }()

	var httpSrv *http.Server
	var hl net.Listener
	httpDone := make(chan error, 1)
	if cfg.HTTPAddr != "" && cfg.HTTPAddr != "off" {
		hl, err = net.Listen("tcp", cfg.HTTPAddr)
		if err != nil {
			gs.Stop()
			return fmt.Errorf("--http-addr: %w", err)
		}
		where.HTTP = hl.Addr().String()
		httpSrv = &http.Server{
			Handler: httpapi.New(httpapi.Config{
				Broker:         b,
				DefaultProject: cfg.Project,
				Ready:          func(ctx context.Context) error { return checkReady(ctx, nc, js) },
				Logger:         log,
				PubSub:         api, // the Pub/Sub REST API, over the gRPC server's methods

				WebhookAllowedOrigins: cfg.WebhookAllowedOrigins,
				WebhookAllowedRate:    cfg.WebhookAllowedRate,
			}),
			ReadHeaderTimeout: 10 * time.Second,
			TLSConfig:         tlsConf,
			// Failed handshakes and the like: to our log, not the standard one.
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		go func() {
			if tlsConf != nil {
				httpDone <- httpSrv.ServeTLS(hl, "", "")
			} else {
				httpDone <- httpSrv.Serve(hl)
			}
		}()
	}

	attrs := []any{"grpc", where.GRPC, "http", orOff(where.HTTP), "tls", tlsConf != nil}
	if srv != nil {
		attrs = append(attrs, "nats", "embedded", "data_dir", cfg.DataDir, "nats_listen", orOff(where.NATS))
	} else {
		attrs = append(attrs, "nats", redactURLs(nc.ConnectedUrl()))
	}
	log.Info("jetorder sidecar listening", attrs...)
	// The APIs have no authentication of their own, and the embedded
	// server none at all: say so when others can reach them.
	if tlsConf == nil && beyondLoopback(gl.Addr()) {
		log.Warn("the gRPC API listens beyond loopback without TLS", "grpc", where.GRPC)
	}
	if tlsConf == nil && httpSrv != nil && beyondLoopback(hl.Addr()) {
		log.Warn("the HTTP API listens beyond loopback without TLS", "http", where.HTTP)
	}
	if srv != nil && where.NATS != "" && beyondLoopback(srv.Addr()) {
		log.Warn("--nats-listen exposes the embedded nats-server, which has no authentication, beyond loopback", "nats_listen", where.NATS)
	}
	if ready != nil {
		ready(where)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-grpcDone:
		runErr = fmt.Errorf("gRPC server: %w", err)
	case err := <-httpDone:
		runErr = fmt.Errorf("HTTP server: %w", err)
	}
	log.Info("shutting down")
	stopHealth()
	hs.Shutdown() // NOT_SERVING: load balancers stop sending new work
	dctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	api.Drain(dctx) // clients settle what they hold
	cancel()
	if httpSrv != nil {
		hctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		_ = httpSrv.Shutdown(hctx) // in-flight publishes finish
		cancel()
	}
	api.Close() // the rest goes back; streams end with UNAVAILABLE
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(cfg.ShutdownTimeout):
		gs.Stop()
	}
	b.Close() // flush publishes
	if err := nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		log.Warn("drain NATS connection", "err", err)
	}
	log.Info("stopped")
	return runErr
}

// connect starts the embedded server, unless cfg names an external one,
// and connects to it.
func connect(cfg Config, log *slog.Logger) (*nats.Conn, *embedded.Server, error) {
	opts := []nats.Option{
		nats.Name("jetorder-sidecar"),
		nats.MaxReconnects(-1),
		nats.ReconnectBufSize(-1), // the adapter requires it: see adapter.NewClient
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
		ecfg := embedded.Config{StoreDir: cfg.DataDir, NoListen: cfg.NATSListen == "", Logger: log}
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
		nc, err := nats.Connect("", append(opts, nats.InProcessServer(srv))...)
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
