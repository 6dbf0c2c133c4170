package main

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

func TestParseConfig(t *testing.T) {
	t.Setenv("JETORDER_DATA_DIR", "/from/env")
	cfg, err := parseConfig(nil)
	if err != nil || cfg.dataDir != "/from/env" || cfg.natsListen != "" {
		t.Fatalf("env default: %+v, %v", cfg, err)
	}
	cfg, err = parseConfig([]string{"--data-dir", "/from/flag", "--nats-listen", "127.0.0.1:4222"})
	if err != nil || cfg.dataDir != "/from/flag" || cfg.natsListen != "127.0.0.1:4222" {
		t.Fatalf("flags: %+v, %v", cfg, err)
	}
	if _, err := parseConfig([]string{"--nats-url", "nats://x", "--nats-listen", "127.0.0.1:4222"}); err == nil {
		t.Fatal("--nats-url with --nats-listen accepted")
	}
	if _, err := parseConfig([]string{"--no-such-flag"}); err == nil {
		t.Fatal("unknown flag accepted")
	}
}

// run starts the embedded server, reports ready, and returns nil once its
// context ends.
func TestRunStopsCleanly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- run(ctx, config{dataDir: t.TempDir()}, slog.New(slog.DiscardHandler), func() { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("run ended before ready: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not ready within 20s")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not stop within 20s of cancel")
	}
}
