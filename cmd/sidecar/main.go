// Command sidecar runs jetorder beside an application. It serves the Google
// Pub/Sub v1 gRPC API (point Google's client libraries at it with
// PUBSUB_EMULATOR_HOST) and an HTTP API for CloudEvents and plain messages,
// by default over an embedded nats-server (JetStream, file storage under
// --data-dir), or over an existing NATS server or cluster with --nats-url.
//
// Every flag can also be set by environment: --data-dir is
// JETORDER_DATA_DIR, --grpc-addr is JETORDER_GRPC_ADDR, and so on. A flag
// given on the command line wins. --version prints what was built and
// exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/embedded"
	"github.com/jetorder/jetorder/internal/pubsubapi"
	"github.com/jetorder/jetorder/internal/push"
	"github.com/jetorder/jetorder/internal/resources"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/keyrouter"
)

type config struct {
	sidecar.Config
	logLevel  slog.Level
	logFormat string // "text" or "json"
	version   bool   // print the version and exit
}

// usageHead comes before the flags in the -h output.
const usageHead = `Usage: sidecar [flags]

The jetorder sidecar: the Google Pub/Sub v1 gRPC API and an HTTP API with
ordering keys, over an embedded nats-server (JetStream store in --data-dir)
or an existing NATS server or cluster (--nats-url).

Every flag can also be set as JETORDER_<FLAG>, upper case with _ for -
(--grpc-addr is JETORDER_GRPC_ADDR); a flag given here wins.

Flags:
`

// parseConfig reads the flags in args, with the environment's values as
// their defaults. On -h it writes the usage to help and returns
// flag.ErrHelp. It prints nothing else: the caller prints a returned error
// (once).
func parseConfig(args []string, help io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	// flag would print a parse error and the whole usage itself, and the
	// caller the error again: both go through the returned error instead.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	str := func(p *string, name, def, usage string) { fs.StringVar(p, name, envOr(name, def), usage) }
	str(&c.GRPCAddr, "grpc-addr", "127.0.0.1:8085", "Pub/Sub gRPC API address (PUBSUB_EMULATOR_HOST for clients)")
	str(&c.HTTPAddr, "http-addr", "127.0.0.1:8080", `HTTP API address: publish, the status page (/), /healthz, /readyz, /metrics ("off" disables it)`)
	str(&c.TLSCert, "tls-cert", "", "certificate file: serve the gRPC and HTTP APIs over TLS")
	str(&c.TLSKey, "tls-key", "", "private key file for --tls-cert")
	str(&c.TLSClientCA, "tls-client-ca", "", "CA file: verify client certificates, whose CommonName or email address names the principal (access control; needs --tls-cert)")
	str(&c.AuthTokens, "auth-tokens", "", `bearer tokens file: one "PRINCIPAL TOKEN" or "PRINCIPAL sha256:HEX" per line, PRINCIPAL user:ID or serviceAccount:ID (access control)`)
	str(&c.AuthJWKS, "auth-jwks", "", "JWKS file: bearer JWTs signed by its keys name principals, e.g. Kubernetes service-account tokens (access control; needs --auth-jwt-audience)")
	str(&c.AuthJWTIssuer, "auth-jwt-issuer", "", `the "iss" JWTs must have (default: any)`)
	var audiences, openEndpoints, allowUnauth string
	str(&audiences, "auth-jwt-audience", "", `audiences JWTs must name one of, comma-separated`)
	str(&c.IAMPolicy, "iam-policy", "", `project-level IAM policy file, Google's Policy JSON ({"bindings":[{"role":"roles/pubsub.publisher","members":["user:…"]}]}); default: every authenticated caller is roles/pubsub.admin`)
	str(&openEndpoints, "open-endpoints", "healthz,readyz", `HTTP endpoints served without access control, of healthz, readyz and metrics ("" none)`)
	str(&allowUnauth, "allow-unauthenticated", "false", "serve without access control on addresses beyond loopback, and --nats-listen there without authentication (the sidecar refuses to otherwise)")
	str(&c.DataDir, "data-dir", "./data", "JetStream store of the embedded nats-server")
	var syncPolicy, natsStart string
	str(&natsStart, "nats-start-timeout", embedded.DefaultReadyTimeout.String(), "how long the embedded nats-server may take to start: it recovers every stream and consumer of --data-dir first (progress is logged every 10s)")
	str(&syncPolicy, "sync", string(embedded.SyncGroup), `when the embedded server's writes reach disk before callers hear of them: "group" (group commit: every publish result and every created resource waits for a shared fsync), "always" (the server fsyncs each write; slower) or "lazy" (JetStream's default, a background fsync every 2 minutes: fastest, but a power cut or OS crash loses acknowledged publishes, topics and subscriptions written since)`)
	str(&c.NATSListen, "nats-listen", "", "also expose the embedded server's client port, e.g. 127.0.0.1:4222 (default: off; beyond loopback it needs --nats-listen-user or --nats-listen-tls-client-ca)")
	str(&c.NATSListenUser, "nats-listen-user", "", "user name clients of --nats-listen must give (with --nats-listen-password)")
	str(&c.NATSListenPassword, "nats-listen-password", "", "their password, at least 16 characters, or its bcrypt hash ($2a$...) (prefer JETORDER_NATS_LISTEN_PASSWORD)")
	str(&c.NATSListenTLSCert, "nats-listen-tls-cert", "", "certificate file: serve --nats-listen over TLS")
	str(&c.NATSListenTLSKey, "nats-listen-tls-key", "", "private key file for --nats-listen-tls-cert")
	str(&c.NATSListenTLSClientCA, "nats-listen-tls-client-ca", "", "CA file: clients of --nats-listen must present a certificate it signed (needs --nats-listen-tls-cert)")
	str(&c.NATSURL, "nats-url", "", "use this NATS server or cluster (comma-separated URLs) instead of the embedded one")
	str(&c.NATSCreds, "nats-creds", "", "credentials (JWT) file for --nats-url")
	str(&c.NATSNKey, "nats-nkey", "", "nkey seed file for --nats-url")
	str(&c.NATSUser, "nats-user", "", "user name for --nats-url")
	str(&c.NATSPassword, "nats-password", "", "password for --nats-url (prefer JETORDER_NATS_PASSWORD)")
	str(&c.NATSToken, "nats-token", "", "token for --nats-url (prefer JETORDER_NATS_TOKEN)")
	str(&c.NATSTLSCA, "nats-tls-ca", "", "CA file to verify the NATS server")
	str(&c.NATSTLSCert, "nats-tls-cert", "", "client certificate file for NATS")
	str(&c.NATSTLSKey, "nats-tls-key", "", "client key file for NATS")
	str(&c.Project, "project", "default", "project of HTTP routes that name none")
	str(&c.Name, "name", "", "this sidecar's name, shown on the other sidecars' status pages as a partition's holder and in its metrics' sidecar label (default: host name:gRPC port)")
	var logLevel string
	str(&logLevel, "log-level", "info", "debug, info, warn or error; debug logs every gRPC call and HTTP request")
	str(&c.logFormat, "log-format", "text", `"text" (key=value) or "json" (one object per line), on stderr`)
	fs.BoolVar(&c.version, "version", false, "print the version, the commit, and the nats-server version, and exit")
	var ordering string
	str(&ordering, "ordering", string(pubsubapi.StrictOrdering), `when a key's next message goes to a client on ordered subscriptions without a jetorder-ordering label: "strict" (once the previous one is acked) or "pipelined" (without waiting for acks, for clients that run a key's handlers one at a time; docs/SIDECAR.md)`)
	var delivery, keyStreams, replicas, maxOutstanding, maxStreams, shutdown, webhookOrigins, webhookRate, pushMax string
	str(&delivery, "delivery", string(adapter.DefaultDelivery), `delivery of ordered subscriptions created without a jetorder-delivery label: "per-key" or "partitioned" (docs/SIDECAR.md)`)
	str(&keyStreams, "key-streams", "1", `streams the keyed messages of topics created without a jetorder-key-streams label are split over: 1, 2, 4, 8 or 16 (faster partitioned delivery of many keys; docs/SIDECAR.md, "Key streams")`)
	str(&replicas, "replicas", "1", "replicas of the streams and buckets the sidecar creates (3 in a cluster)")
	str(&maxOutstanding, "max-outstanding-messages", "1000", "messages one subscription holds in the sidecar: with clients or waiting for one")
	str(&maxStreams, "max-streams", "1000", "open StreamingPull streams")
	str(&shutdown, "shutdown-timeout", "5s", "how long shutdown may take; clients have the first three quarters of it to ack what they hold")
	str(&webhookOrigins, "webhook-allowed-origins", "*", `CloudEvents webhook validation: origins granted, comma-separated ("*" all, "*.example.com" its subdomains)`)
	str(&webhookRate, "webhook-allowed-rate", "*", `CloudEvents webhook validation: requests per minute granted ("*" no limit; advisory, not enforced)`)
	str(&c.PushAllow, "push-allow", push.DefaultAllow, `push endpoints subscriptions may name, comma-separated: "loopback", host names, *.domain, IPs, CIDR prefixes, each with an optional :port ("off" disables push)`)
	str(&c.Resources, "resources", "", `file of topics, subscriptions and schemas to create or bring up to date before serving, YAML or JSON (docs/RUNNING.md, "Declared resources")`)
	str(&pushMax, "push-max-outstanding", strconv.Itoa(pubsubapi.DefaultPushMaxOutstanding), "push requests in flight per subscription, for ordering keys and for unkeyed messages each")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(help)
			fmt.Fprint(help, usageHead)
			fs.PrintDefaults()
		}
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if c.version {
		return c, nil // the rest does not matter
	}
	var err error
	if e := c.logLevel.UnmarshalText([]byte(logLevel)); e != nil {
		err = errors.Join(err, fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel))
	}
	switch c.logFormat {
	case "text", "json":
	default:
		err = errors.Join(err, fmt.Errorf("--log-format %q: want text or json", c.logFormat))
	}
	positive := func(name, v string) int {
		n, e := strconv.Atoi(v)
		if e != nil || n < 1 {
			err = errors.Join(err, fmt.Errorf("--%s %q: want a positive integer", name, v))
		}
		return n
	}
	switch adapter.DeliveryMode(delivery) {
	case adapter.DeliveryPerKey, adapter.DeliveryPartitioned:
		c.Delivery = adapter.DeliveryMode(delivery)
	default:
		err = errors.Join(err, fmt.Errorf("--delivery %q: want per-key or partitioned", delivery))
	}
	if n, e := strconv.Atoi(keyStreams); e != nil || !keyrouter.ValidKeyStreams(n) {
		err = errors.Join(err, fmt.Errorf("--key-streams %q: want 1, 2, 4, 8 or 16", keyStreams))
	} else {
		c.KeyStreams = n
	}
	switch pubsubapi.Ordering(ordering) {
	case pubsubapi.StrictOrdering, pubsubapi.PipelinedOrdering:
		c.Ordering = pubsubapi.Ordering(ordering)
	default:
		err = errors.Join(err, fmt.Errorf("--ordering %q: want strict or pipelined", ordering))
	}
	if p, e := embedded.ParseSyncPolicy(syncPolicy); e != nil {
		err = errors.Join(err, fmt.Errorf("--sync %q: want group, always or lazy", syncPolicy))
	} else {
		c.Sync = p
	}
	c.Replicas = positive("replicas", replicas)
	c.MaxOutstandingMessages = positive("max-outstanding-messages", maxOutstanding)
	c.MaxStreams = positive("max-streams", maxStreams)
	c.PushMaxOutstanding = positive("push-max-outstanding", pushMax)
	switch strings.TrimSpace(c.PushAllow) {
	case "", "off":
		c.PushAllow = "off" // nothing allowed
	default:
		if _, e := push.ParseAllowList(c.PushAllow); e != nil {
			err = errors.Join(err, e)
		}
	}
	if d, e := time.ParseDuration(shutdown); e != nil || d <= 0 {
		err = errors.Join(err, fmt.Errorf("--shutdown-timeout %q: want a duration such as 5s", shutdown))
	} else {
		c.ShutdownTimeout = d
	}
	if d, e := time.ParseDuration(natsStart); e != nil || d <= 0 {
		err = errors.Join(err, fmt.Errorf("--nats-start-timeout %q: want a duration such as 5m", natsStart))
	} else {
		c.NATSStartTimeout = d
	}
	if o, e := parseOrigins(webhookOrigins); e != nil {
		err = errors.Join(err, fmt.Errorf("--webhook-allowed-origins %q: %w", webhookOrigins, e))
	} else {
		c.WebhookAllowedOrigins = o
	}
	for a := range strings.SplitSeq(audiences, ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.AuthJWTAudiences = append(c.AuthJWTAudiences, a)
		}
	}
	for e := range strings.SplitSeq(openEndpoints, ",") {
		switch e = strings.TrimSpace(e); e {
		case "":
		case "healthz", "readyz", "metrics":
			c.OpenEndpoints = append(c.OpenEndpoints, "/"+e)
		default:
			err = errors.Join(err, fmt.Errorf("--open-endpoints: %q is not one of healthz, readyz, metrics", e))
		}
	}
	if b, e := strconv.ParseBool(allowUnauth); e != nil {
		err = errors.Join(err, fmt.Errorf("--allow-unauthenticated %q: want true or false", allowUnauth))
	} else {
		c.AllowUnauthenticated = b
	}
	if webhookRate != "*" {
		c.WebhookAllowedRate = positive("webhook-allowed-rate", webhookRate)
	}
	if err != nil {
		return c, err
	}
	if c.NATSURL != "" && c.NATSListen != "" {
		return c, errors.New("--nats-listen applies to the embedded server; it cannot be combined with --nats-url")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return c, errors.New("--tls-cert and --tls-key go together")
	}
	if c.TLSClientCA != "" && c.TLSCert == "" {
		return c, errors.New("--tls-client-ca needs --tls-cert and --tls-key: client certificates are verified in the TLS handshake")
	}
	if c.AuthJWKS == "" && (c.AuthJWTIssuer != "" || len(c.AuthJWTAudiences) > 0) {
		return c, errors.New("--auth-jwt-issuer and --auth-jwt-audience apply to --auth-jwks")
	}
	if c.AuthJWKS != "" && len(c.AuthJWTAudiences) == 0 {
		return c, errors.New("--auth-jwks needs --auth-jwt-audience: a JWT for another service must not pass")
	}
	if c.IAMPolicy != "" && c.TLSClientCA+c.AuthTokens+c.AuthJWKS == "" {
		return c, errors.New("--iam-policy needs a way to authenticate callers: --auth-tokens, --tls-client-ca or --auth-jwks")
	}
	if (c.NATSTLSCert == "") != (c.NATSTLSKey == "") {
		return c, errors.New("--nats-tls-cert and --nats-tls-key go together")
	}
	if c.NATSURL == "" && c.NATSCreds+c.NATSNKey+c.NATSUser+c.NATSPassword+c.NATSToken+c.NATSTLSCA+c.NATSTLSCert != "" {
		// They are how the sidecar connects; the embedded server's client
		// port has flags of its own.
		return c, errors.New("the --nats-creds, --nats-nkey, --nats-user, --nats-password, --nats-token and --nats-tls-* flags apply to --nats-url (the clients of --nats-listen authenticate with --nats-listen-user, --nats-listen-password and --nats-listen-tls-*)")
	}
	if err := c.CheckNATSListen(); err != nil {
		return c, err
	}
	return c, nil
}

// parseOrigins reads --webhook-allowed-origins: "*", or names such as
// eventemitter.example.com and patterns such as *.example.com, separated by
// commas.
func parseOrigins(s string) ([]string, error) {
	var out []string
	for o := range strings.SplitSeq(s, ",") {
		o = strings.TrimSpace(o)
		name := strings.TrimPrefix(o, "*.")
		switch {
		case o == "*":
			return []string{"*"}, nil
		case name == "":
			return nil, errors.New(`want "*" or comma-separated origins, none empty`)
		case strings.ContainsAny(name, "* \t"):
			return nil, fmt.Errorf("origin %q: want a name such as eventemitter.example.com, or *.example.com", o)
		}
		out = append(out, o)
	}
	return out, nil
}

// envOr reads JETORDER_<FLAG>, the flag name upper-cased with - as _.
func envOr(flagName, def string) string {
	if v, ok := os.LookupEnv("JETORDER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))); ok {
		return v
	}
	return def
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, logProcessWide)
	stop()
	os.Exit(code)
}

// run is the sidecar's command: it parses args, then prints the version,
// or logs to stderr and serves until ctx ends. It returns the exit code: 0
// after a shutdown ctx asked for (or -h, or --version), 1 when the sidecar
// failed, 2 for a bad command line or a --resources file that is not
// valid. global, if not nil, is given the logger before the sidecar
// starts.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, global func(*slog.Logger)) int {
	cfg, err := parseConfig(args, stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "sidecar: %v\nRun sidecar -h for the flags.\n", err)
		return 2
	case cfg.version:
		bi, _ := debug.ReadBuildInfo()
		fmt.Fprint(stdout, version(bi, commit))
		return 0
	}
	if cfg.Resources != "" {
		// A file that is not valid is a configuration error, as a bad flag
		// is: said plainly, each problem on its line, before anything starts.
		// (Run reads it again, for its other callers.)
		if _, err := resources.Load(cfg.Resources); err != nil {
			fmt.Fprintf(stderr, "sidecar: --resources: %v\n", err)
			return 2
		}
	}
	log := newLogger(stderr, cfg.logFormat, cfg.logLevel)
	if global != nil {
		global(log)
	}
	if err := sidecar.Run(ctx, cfg.Config, log, nil); err != nil {
		log.Error("sidecar stopped", "err", err)
		return 1
	}
	return 0
}
