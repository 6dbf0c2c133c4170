package main

import (
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

func TestParseConfig(t *testing.T) {
	t.Setenv("JETORDER_DATA_DIR", "/from/env")
	t.Setenv("JETORDER_MAX_STREAMS", "7")
	cfg, err := parseConfig(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/from/env" || cfg.MaxStreams != 7 || cfg.NATSListen != "" ||
		cfg.GRPCAddr != "127.0.0.1:8085" || cfg.HTTPAddr != "127.0.0.1:8080" || cfg.ShutdownTimeout != 5*time.Second ||
		cfg.NATSStartTimeout != 5*time.Minute {
		t.Fatalf("defaults and env: %+v", cfg)
	}
	if cfg, err = parseConfig([]string{"--nats-start-timeout", "90s"}, io.Discard); err != nil || cfg.NATSStartTimeout != 90*time.Second {
		t.Errorf("--nats-start-timeout 90s: %v, %v", cfg.NATSStartTimeout, err)
	}
	cfg, err = parseConfig([]string{"--data-dir", "/from/flag", "--nats-listen", "127.0.0.1:4222", "--grpc-addr", ":9000"}, io.Discard)
	if err != nil || cfg.DataDir != "/from/flag" || cfg.NATSListen != "127.0.0.1:4222" || cfg.GRPCAddr != ":9000" {
		t.Fatalf("flags: %+v, %v", cfg, err)
	}
	if cfg.Resources != "" {
		t.Errorf("resources by default: %q, want none", cfg.Resources)
	}
	t.Setenv("JETORDER_RESOURCES", "/etc/jetorder/resources.yaml")
	if cfg, err = parseConfig(nil, io.Discard); err != nil || cfg.Resources != "/etc/jetorder/resources.yaml" {
		t.Errorf("resources from env: %q, %v", cfg.Resources, err)
	}
	if cfg, err = parseConfig([]string{"--resources", "r.json"}, io.Discard); err != nil || cfg.Resources != "r.json" {
		t.Errorf("resources from flag over env: %q, %v", cfg.Resources, err)
	}
	for _, bad := range [][]string{
		{"--nats-url", "nats://x", "--nats-listen", "127.0.0.1:4222"},
		{"--no-such-flag"},
		{"--replicas", "0"},
		{"--max-streams", "many"},
		{"--shutdown-timeout", "soon"},
		{"--nats-start-timeout", "0s"},
		{"--tls-cert", "cert.pem"},
		{"--nats-url", "nats://x", "--nats-tls-key", "key.pem"},
		{"--nats-user", "u", "--nats-password", "p"}, // without --nats-url
		{"--nats-tls-ca", "ca.pem"},
		{"--webhook-allowed-origins", ""},
		{"--webhook-allowed-origins", "a.example.com,,b.example.com"},
		{"--webhook-allowed-origins", "a.example.com b.example.com"},
		{"--webhook-allowed-origins", "*example.com"},
		{"--webhook-allowed-origins", "*."},
		{"--webhook-allowed-rate", "0"},
		{"--webhook-allowed-rate", "-5"},
		{"--webhook-allowed-rate", "fast"},
		{"stray"},
		{"--tls-client-ca", "ca.pem"},                             // without --tls-cert
		{"--auth-jwks", "jwks.json"},                              // without an audience
		{"--auth-jwt-audience", "jetorder"},                       // without --auth-jwks
		{"--iam-policy", "policy.json"},                           // without authentication
		{"--auth-tokens", "tokens", "--open-endpoints", "status"}, // not an endpoint
		{"--allow-unauthenticated", "maybe"},
	} {
		if _, err := parseConfig(bad, io.Discard); err == nil {
			t.Errorf("parseConfig(%q) accepted", bad)
		}
	}
}

// The webhook validation flags: every origin ("*") and no rate limit (0)
// by default, a list and a rate when given, by flag or environment.
func TestParseConfigWebhook(t *testing.T) {
	cfg, err := parseConfig(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.WebhookAllowedOrigins, []string{"*"}) || cfg.WebhookAllowedRate != 0 {
		t.Errorf("defaults: origins %q, rate %d", cfg.WebhookAllowedOrigins, cfg.WebhookAllowedRate)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		origins []string
		rate    int
	}{
		{name: "list and rate", args: []string{"--webhook-allowed-origins", "eventemitter.example.com, *.example.org", "--webhook-allowed-rate", "120"},
			origins: []string{"eventemitter.example.com", "*.example.org"}, rate: 120},
		{name: "star wins", args: []string{"--webhook-allowed-origins", "a.example.com,*", "--webhook-allowed-rate", "*"},
			origins: []string{"*"}, rate: 0},
		{name: "environment", env: map[string]string{"JETORDER_WEBHOOK_ALLOWED_ORIGINS": "events.example.com", "JETORDER_WEBHOOK_ALLOWED_RATE": "60"},
			origins: []string{"events.example.com"}, rate: 60},
		{name: "flag over environment", args: []string{"--webhook-allowed-rate", "30"}, env: map[string]string{"JETORDER_WEBHOOK_ALLOWED_RATE": "60"},
			origins: []string{"*"}, rate: 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			cfg, err := parseConfig(tc.args, io.Discard)
			if err != nil || !slices.Equal(cfg.WebhookAllowedOrigins, tc.origins) || cfg.WebhookAllowedRate != tc.rate {
				t.Errorf("parseConfig(%q) with env %v: origins %q, rate %d, err %v; want %q, %d",
					tc.args, tc.env, cfg.WebhookAllowedOrigins, cfg.WebhookAllowedRate, err, tc.origins, tc.rate)
			}
		})
	}
}

// By default nothing listens beyond loopback and the embedded server has no
// client port; secrets can come from the environment, out of sight of ps.
func TestParseConfigSecurityDefaults(t *testing.T) {
	cfg, err := parseConfig(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{cfg.GRPCAddr, cfg.HTTPAddr} {
		host, _, err := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			t.Errorf("default address %q is not loopback", addr)
		}
	}
	if cfg.NATSListen != "" || cfg.NATSURL != "" || cfg.TLSCert != "" {
		t.Errorf("defaults: nats-listen %q, nats-url %q, tls-cert %q", cfg.NATSListen, cfg.NATSURL, cfg.TLSCert)
	}

	t.Setenv("JETORDER_NATS_PASSWORD", "secret")
	t.Setenv("JETORDER_NATS_TOKEN", "tok")
	cfg, err = parseConfig([]string{"--nats-url", "tls://nats:4222", "--nats-user", "app",
		"--nats-tls-ca", "ca.pem", "--nats-tls-cert", "c.pem", "--nats-tls-key", "k.pem"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATSUser != "app" || cfg.NATSPassword != "secret" || cfg.NATSToken != "tok" ||
		cfg.NATSTLSCA != "ca.pem" || cfg.NATSTLSCert != "c.pem" || cfg.NATSTLSKey != "k.pem" {
		t.Errorf("credentials: %+v", cfg.Config)
	}
}

func TestParseConfigAccess(t *testing.T) {
	cfg, err := parseConfig(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AllowUnauthenticated || !slices.Equal(cfg.OpenEndpoints, []string{"/healthz", "/readyz"}) {
		t.Errorf("defaults: allow-unauthenticated %v, open endpoints %v", cfg.AllowUnauthenticated, cfg.OpenEndpoints)
	}
	t.Setenv("JETORDER_ALLOW_UNAUTHENTICATED", "true")
	cfg, err = parseConfig([]string{"--auth-jwks", "jwks.json", "--auth-jwt-audience", "a, b", "--open-endpoints", "metrics,healthz", "--auth-tokens", "tokens", "--iam-policy", "p.json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.AllowUnauthenticated || !slices.Equal(cfg.AuthJWTAudiences, []string{"a", "b"}) || !slices.Equal(cfg.OpenEndpoints, []string{"/metrics", "/healthz"}) || cfg.IAMPolicy != "p.json" {
		t.Errorf("parsed %+v", cfg.Config)
	}
}

// The authentication of --nats-listen: user, password and TLS files by
// flag or environment; combinations that cannot work are a bad command
// line naming the flags.
func TestParseConfigNATSListen(t *testing.T) {
	const password = "a-password-of-24-chars!!"
	t.Setenv("JETORDER_NATS_LISTEN_PASSWORD", password)
	t.Setenv("JETORDER_NATS_LISTEN_TLS_CLIENT_CA", "ca.pem")
	cfg, err := parseConfig([]string{"--nats-listen", "0.0.0.0:4222", "--nats-listen-user", "ops",
		"--nats-listen-tls-cert", "c.pem", "--nats-listen-tls-key", "k.pem"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATSListenUser != "ops" || cfg.NATSListenPassword != password || cfg.NATSListenTLSCert != "c.pem" ||
		cfg.NATSListenTLSKey != "k.pem" || cfg.NATSListenTLSClientCA != "ca.pem" {
		t.Errorf("parsed %+v", cfg.Config)
	}

	t.Setenv("JETORDER_NATS_LISTEN_PASSWORD", "")
	t.Setenv("JETORDER_NATS_LISTEN_TLS_CLIENT_CA", "")
	// A bcrypt hash of any password, whatever its length.
	hash, err := bcrypt.GenerateFromPassword([]byte("short"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err = parseConfig([]string{"--nats-listen", ":4222", "--nats-listen-user", "ops", "--nats-listen-password", string(hash)}, io.Discard)
	if err != nil || cfg.NATSListenPassword != string(hash) {
		t.Errorf("a bcrypt hash: %q, %v", cfg.NATSListenPassword, err)
	}

	listen := []string{"--nats-listen", "0.0.0.0:4222"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nats-listen-user", "ops", "--nats-listen-password", password}, "apply to --nats-listen"},
		{[]string{"--nats-url", "nats://x", "--nats-listen-tls-client-ca", "ca.pem"}, "apply to --nats-listen"},
		{append(listen, "--nats-listen-user", "ops"), "--nats-listen-user and --nats-listen-password go together"},
		{append(listen, "--nats-listen-password", password), "--nats-listen-user and --nats-listen-password go together"},
		{append(listen, "--nats-listen-user", "ops", "--nats-listen-password", "short"), "shorter than 16"},
		{append(listen, "--nats-listen-user", "ops", "--nats-listen-password", "$2a$10$not-a-hash"), "not one"},
		{append(listen, "--nats-listen-tls-cert", "c.pem"), "--nats-listen-tls-cert and --nats-listen-tls-key go together"},
		{append(listen, "--nats-listen-tls-client-ca", "ca.pem"), "--nats-listen-tls-client-ca needs --nats-listen-tls-cert"},
		{append(listen, "--nats-user", "ops", "--nats-password", password), "--nats-listen-user"}, // the flags of --nats-url
	} {
		_, err := parseConfig(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseConfig(%q) = %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}
