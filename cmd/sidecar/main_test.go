package main

import (
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	t.Setenv("JETORDER_DATA_DIR", "/from/env")
	t.Setenv("JETORDER_MAX_STREAMS", "7")
	cfg, err := parseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/from/env" || cfg.MaxStreams != 7 || cfg.NATSListen != "" ||
		cfg.GRPCAddr != "127.0.0.1:8085" || cfg.HTTPAddr != "127.0.0.1:8080" || cfg.ShutdownTimeout != 5*time.Second {
		t.Fatalf("defaults and env: %+v", cfg)
	}
	cfg, err = parseConfig([]string{"--data-dir", "/from/flag", "--nats-listen", "127.0.0.1:4222", "--grpc-addr", ":9000"})
	if err != nil || cfg.DataDir != "/from/flag" || cfg.NATSListen != "127.0.0.1:4222" || cfg.GRPCAddr != ":9000" {
		t.Fatalf("flags: %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{
		{"--nats-url", "nats://x", "--nats-listen", "127.0.0.1:4222"},
		{"--no-such-flag"},
		{"--replicas", "0"},
		{"--max-streams", "many"},
		{"--shutdown-timeout", "soon"},
		{"--tls-cert", "cert.pem"},
		{"stray"},
	} {
		if _, err := parseConfig(bad); err == nil {
			t.Errorf("parseConfig(%q) accepted", bad)
		}
	}
}
