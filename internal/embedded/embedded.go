// Package embedded starts nats-server with JetStream inside the current
// process: a single node for the sidecar and tests, and a small loopback
// cluster for tests where clustering matters.
package embedded

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ErrNotReady is returned when a server does not accept connections within
// the start-up timeout.
var ErrNotReady = errors.New("embedded: nats-server not ready")

// DefaultReadyTimeout bounds start-up when Config.ReadyTimeout is zero. A
// server recovers its whole store (every stream and consumer) before it
// accepts connections, which takes seconds for thousands of consumers on a
// busy machine.
const DefaultReadyTimeout = 5 * time.Minute

// startProgressEvery is how often a start still under way is logged.
const startProgressEvery = 10 * time.Second

// MaxPayload is the embedded server's max_payload: a 10 MiB Pub/Sub
// message with 100 attributes, percent-encoded, and the identity headers.
const MaxPayload = 12 << 20

// Config describes one embedded node.
type Config struct {
	// StoreDir is where JetStream keeps its file store. Required.
	StoreDir string
	// Host is the client listen host; default 127.0.0.1.
	Host string
	// Port is the client port; 0 picks a random free port. (-1 also means random.)
	Port int
	// NoListen, when true, does not open a client port at all: clients reach
	// the server through InProcessConn only.
	NoListen bool
	// ServerName names the node; nats-server picks one if empty.
	ServerName string
	// ReadyTimeout bounds start-up, recovering the store included;
	// default DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// Logger receives the server's own log: notices at debug level,
	// warnings and errors at theirs. Nil discards it; a fatal error ends
	// Start with it either way.
	Logger *slog.Logger
	// Sync is when writes reach stable storage: SyncGroup (the default,
	// with "" meaning it), SyncAlways or SyncLazy.
	Sync SyncPolicy
	// Configure, if set, changes the options last, before the server is
	// created: authentication, TLS, operator mode and anything else the
	// fields above do not cover.
	Configure func(*server.Options)

	// cluster settings, set by StartCluster.
	clusterName   string
	clusterPort   int
	clusterRoutes []string
}

// Server is a running embedded nats-server.
type Server struct {
	*server.Server
	lock   *storeLock
	policy SyncPolicy
	syncer *groupSyncer // nil unless policy is SyncGroup
}

// Start starts one JetStream-enabled node and waits until it accepts
// connections. Stop it with Shutdown.
//
// It fails at once, naming the cause, when the store directory is not a
// writable directory (ErrStoreDir), another process has it
// (ErrStoreLocked), the client port is taken (ErrPortInUse), or the server
// reports a fatal error while starting.
func Start(cfg Config) (*Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("embedded: StoreDir is required")
	}
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if err := checkStoreDir(cfg.StoreDir); err != nil {
		return nil, err
	}
	policy, err := ParseSyncPolicy(string(cfg.Sync))
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	lock, err := lockStore(cfg.StoreDir)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			lock.release()
		}
	}()
	if !cfg.NoListen && port > 0 {
		if err := checkPort(host, port); err != nil {
			return nil, err
		}
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       host,
		Port:       port,
		DontListen: cfg.NoListen,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		// Per-key consumers: a stream has as many consumers as active keys.
		JetStreamLimits: server.JSLimitOpts{DefaultMaxConsumers: -1},
		// Pub/Sub accepts messages of 10 MB, which with their attributes
		// and jetorder's headers need more than the 8 MiB nats-server
		// accepts without a warning: it warns once at start that payloads
		// this large are "generally discouraged" (logBridge lowers that
		// warning to debug: it is this setting's, not the operator's).
		MaxPayload: MaxPayload,
		SyncAlways: policy == SyncAlways,
	}
	if policy == SyncGroup {
		// What no caller waits for, the server syncs itself within a
		// second: chiefly a block compacted into a new file renamed over
		// the old one, written without fsync, whose messages were durable
		// before (docs/RELIABILITY.md, "Power cuts").
		opts.SyncInterval = groupSyncInterval
	}
	if cfg.clusterName != "" {
		opts.Cluster = server.ClusterOpts{
			Name: cfg.clusterName,
			Host: "127.0.0.1",
			Port: cfg.clusterPort,
		}
		opts.Routes = server.RoutesFromStr(strings.Join(cfg.clusterRoutes, ","))
	}
	if cfg.Configure != nil {
		cfg.Configure(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	bridge := newLogBridge(cfg.Logger)
	s.SetLoggerV2(bridge, false, false, false)
	go s.Start()
	timeout := cfg.ReadyTimeout
	if timeout == 0 {
		timeout = DefaultReadyTimeout
	}
	// Wait in short steps, so that a fatal error ends the wait at once.
	begun := time.Now()
	nextProgress := begun.Add(startProgressEvery)
	for deadline := begun.Add(timeout); !s.ReadyForConnections(50 * time.Millisecond); {
		if err := bridge.fatal(); err != nil {
			s.Shutdown()
			return nil, fmt.Errorf("embedded: nats-server: %w", err)
		}
		if time.Now().After(deadline) {
			s.Shutdown()
			return nil, fmt.Errorf("%w after %v", ErrNotReady, timeout)
		}
		if time.Now().After(nextProgress) && cfg.Logger != nil {
			nextProgress = nextProgress.Add(startProgressEvery)
			cfg.Logger.Info("nats-server still starting: recovering its JetStream store", "store", cfg.StoreDir,
				"elapsed", time.Since(begun).Round(time.Second), "timeout", timeout)
		}
	}
	started = true
	es := &Server{Server: s, lock: lock, policy: policy}
	if policy == SyncGroup {
		if es.syncer, err = newGroupSyncer(cfg.StoreDir); err != nil {
			s.Shutdown()
			return nil, err
		}
	}
	return es, nil
}

// Shutdown stops the server, waits until it has stopped, and lets another
// process have its store.
func (s *Server) Shutdown() {
	s.Server.Shutdown()
	s.Server.WaitForShutdown()
	s.lock.release()
}

// Cluster is a set of JetStream nodes routed together on loopback.
type Cluster struct {
	Nodes []*Server
	cfgs  []Config
}

// StartCluster starts n nodes (n >= 3 for R3 streams) on loopback, each with
// its own store under baseDir, and waits until JetStream has a meta leader.
// A route port taken between choosing it and binding it (by another
// process's outgoing connection) makes it start again on new ports, up to
// three times.
func StartCluster(baseDir string, n int) (*Cluster, error) {
	if n < 1 {
		return nil, errors.New("embedded: a cluster needs at least one node")
	}
	for attempt := 1; ; attempt++ {
		c, err := startCluster(filepath.Join(baseDir, "a"+strconv.Itoa(attempt)), n)
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
	}
}

func startCluster(baseDir string, n int) (*Cluster, error) {
	ports := make([]int, n)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	routes := make([]string, n)
	for i, p := range ports {
		routes[i] = "nats-route://127.0.0.1:" + strconv.Itoa(p)
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		c.cfgs = append(c.cfgs, Config{
			StoreDir: filepath.Join(baseDir, "n"+strconv.Itoa(i)),
			// Replicated streams write lazily whatever the policy: group
			// commit has nothing to wait for (Server.Sync).
			Sync:          SyncLazy,
			ServerName:    "n" + strconv.Itoa(i),
			clusterName:   "jetorder-test",
			clusterPort:   ports[i],
			clusterRoutes: routes,
		})
	}
	for i := range c.cfgs {
		s, err := Start(c.cfgs[i])
		if err != nil {
			c.Shutdown()
			return nil, err
		}
		// Keep the client port once chosen, so a restarted node is found
		// again at the same address.
		c.cfgs[i].Port = s.Addr().(*net.TCPAddr).Port
		c.Nodes = append(c.Nodes, s)
	}
	if err := c.waitMetaLeader(20 * time.Second); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) waitMetaLeader(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, s := range c.Nodes {
			if s != nil && s.Running() && s.JetStreamIsLeader() {
				return nil
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("%w: no JetStream meta leader after %v", ErrNotReady, timeout)
}

// ClientURLs is a comma-separated list of every running node's client URL.
func (c *Cluster) ClientURLs() string {
	var urls string
	for _, s := range c.Nodes {
		if s == nil || !s.Running() {
			continue
		}
		if urls != "" {
			urls += ","
		}
		urls += s.ClientURL()
	}
	return urls
}

// StopNode shuts node i down; RestartNode brings it back on the same ports
// and store.
func (c *Cluster) StopNode(i int) {
	if c.Nodes[i] != nil {
		c.Nodes[i].Shutdown()
		c.Nodes[i] = nil
	}
}

// RestartNode starts node i again with its original configuration.
func (c *Cluster) RestartNode(i int) error {
	s, err := Start(c.cfgs[i])
	if err != nil {
		return err
	}
	c.Nodes[i] = s
	return c.waitMetaLeader(20 * time.Second)
}

// Shutdown stops every node.
func (c *Cluster) Shutdown() {
	for i := range c.Nodes {
		c.StopNode(i)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("embedded: pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
