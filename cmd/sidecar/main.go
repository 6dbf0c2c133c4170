// Command sidecar runs jetorder beside an application: by default with an
// embedded nats-server (JetStream, file storage under --data-dir), or over
// an existing NATS server or cluster with --nats-url.
//
// Every flag can also be set by environment: --data-dir is JETORDER_DATA_DIR.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetorder/jetorder/internal/embedded"
)

type config struct {
	dataDir    string
	natsListen string
	natsURL    string
	natsCreds  string
	logLevel   string
}

func parseConfig(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	fs.StringVar(&c.dataDir, "data-dir", envOr("DATA_DIR", "./data"), "JetStream store of the embedded nats-server")
	fs.StringVar(&c.natsListen, "nats-listen", envOr("NATS_LISTEN", ""), "also expose the embedded server's client port, e.g. 127.0.0.1:4222 (default: off)")
	fs.StringVar(&c.natsURL, "nats-url", envOr("NATS_URL", ""), "use this NATS server or cluster instead of the embedded one")
	fs.StringVar(&c.natsCreds, "nats-creds", envOr("NATS_CREDS", ""), "credentials file for --nats-url")
	fs.StringVar(&c.logLevel, "log-level", envOr("LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.natsURL != "" && c.natsListen != "" {
		return c, errors.New("--nats-listen applies to the embedded server; it cannot be combined with --nats-url")
	}
	return c, nil
}

// envOr reads JETORDER_<name>.
func envOr(name, def string) string {
	if v, ok := os.LookupEnv("JETORDER_" + name); ok {
		return v
	}
	return def
}

func main() {
	cfg, err := parseConfig(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar:", err)
		os.Exit(2)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "sidecar: --log-level:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log, nil); err != nil {
		log.Error("sidecar stopped", "err", err)
		os.Exit(1)
	}
}

// run serves until ctx ends; ready, if not nil, is called once it serves.
func run(ctx context.Context, cfg config, log *slog.Logger, ready func()) error {
	var (
		srv  *embedded.Server
		opts = []nats.Option{nats.Name("jetorder-sidecar"), nats.MaxReconnects(-1)}
		url  = cfg.natsURL
	)
	if url == "" {
		ecfg := embedded.Config{StoreDir: cfg.dataDir, NoListen: cfg.natsListen == ""}
		if cfg.natsListen != "" {
			host, port, err := net.SplitHostPort(cfg.natsListen)
			if err != nil {
				return fmt.Errorf("--nats-listen %q: %w", cfg.natsListen, err)
			}
			if ecfg.Port, err = strconv.Atoi(port); err != nil {
				return fmt.Errorf("--nats-listen %q: bad port", cfg.natsListen)
			}
			ecfg.Host = host
		}
		var err error
		if srv, err = embedded.Start(ecfg); err != nil {
			return err
		}
		defer func() {
			srv.Shutdown()
			log.Info("embedded nats-server stopped")
		}()
		opts = append(opts, nats.InProcessServer(srv))
	} else if cfg.natsCreds != "" {
		opts = append(opts, nats.UserCredentials(cfg.natsCreds))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = js.AccountInfo(actx)
	cancel()
	if ctx.Err() != nil {
		return nil // asked to stop while starting
	}
	if err != nil {
		return fmt.Errorf("JetStream not available: %w", err)
	}
	where := []any{"nats", nc.ConnectedUrlRedacted()}
	if srv != nil {
		where = []any{"nats", "embedded", "data-dir", cfg.dataDir, "nats-listen", orOff(cfg.natsListen)}
	}
	log.Info("jetorder sidecar ready", where...)
	if ready != nil {
		ready()
	}
	<-ctx.Done()
	log.Info("shutting down")
	if err := nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		log.Warn("drain NATS connection", "err", err)
	}
	return nil
}

func orOff(s string) string {
	if strings.TrimSpace(s) == "" {
		return "off"
	}
	return s
}
