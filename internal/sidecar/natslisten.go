package sidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"
)

// minNATSListenPassword is the shortest plaintext --nats-listen-password,
// as the shortest bearer token of --auth-tokens: nats-server does not slow
// down guessing.
const minNATSListenPassword = 16

// bcryptHash is what nats-server takes for a bcrypt hash rather than a
// password (its validBcryptPrefix).
var bcryptHash = regexp.MustCompile(`^\$2[abxy]\$\d{2}\$.*`)

// natsListenAuth reports whether clients of the embedded server's client
// port must authenticate: with a password, a client certificate or both.
func (c Config) natsListenAuth() bool {
	return c.NATSListenUser != "" || c.NATSListenTLSClientCA != ""
}

// CheckNATSListen checks the flags of the embedded server's client port
// (--nats-listen and --nats-listen-*) for combinations that cannot work,
// without reading any file. cmd/sidecar calls it to report a bad command
// line; Run calls it again.
func (c Config) CheckNATSListen() error {
	if c.NATSListen == "" && c.NATSListenUser+c.NATSListenPassword+c.NATSListenTLSCert+c.NATSListenTLSKey+c.NATSListenTLSClientCA != "" {
		return errors.New("--nats-listen-user, --nats-listen-password and --nats-listen-tls-* apply to --nats-listen")
	}
	if (c.NATSListenUser == "") != (c.NATSListenPassword == "") {
		return errors.New("--nats-listen-user and --nats-listen-password go together")
	}
	if p := c.NATSListenPassword; p != "" {
		if bcryptHash.MatchString(p) {
			if _, err := bcrypt.Cost([]byte(p)); err != nil {
				return fmt.Errorf("--nats-listen-password starts as a bcrypt hash ($2a$...) but is not one: %w", err)
			}
		} else if len(p) < minNATSListenPassword {
			return fmt.Errorf("--nats-listen-password is shorter than %d characters; give a longer one, or its bcrypt hash", minNATSListenPassword)
		}
	}
	if (c.NATSListenTLSCert == "") != (c.NATSListenTLSKey == "") {
		return errors.New("--nats-listen-tls-cert and --nats-listen-tls-key go together")
	}
	if c.NATSListenTLSClientCA != "" && c.NATSListenTLSCert == "" {
		return errors.New("--nats-listen-tls-client-ca needs --nats-listen-tls-cert and --nats-listen-tls-key: client certificates are verified in the TLS handshake")
	}
	return nil
}

// checkNATSExposure refuses a client port of the embedded server beyond
// loopback that clients need no credentials for, unless
// AllowUnauthenticated says so: whoever reaches it could read every
// message and delete every stream, around access control. It runs before
// the server starts, so such a port never opens.
func checkNATSExposure(ctx context.Context, cfg Config) error {
	if cfg.NATSURL != "" || cfg.NATSListen == "" || cfg.natsListenAuth() || cfg.AllowUnauthenticated {
		return nil
	}
	host, _, err := net.SplitHostPort(cfg.NATSListen)
	if err != nil {
		return fmt.Errorf("--nats-listen %q: %w", cfg.NATSListen, err)
	}
	if loopbackHost(ctx, host) {
		return nil
	}
	return fmt.Errorf("--nats-listen %s listens beyond loopback without authentication: configure --nats-listen-user and --nats-listen-password, or --nats-listen-tls-client-ca (docs/OPERATING.md, \"The embedded server's client port\"), or pass --allow-unauthenticated to let anyone who reaches it read and change every stream", cfg.NATSListen)
}

// loopbackHost tells whether a listener on host is reachable from this
// host only: an IP address on loopback, or a name all of whose addresses
// are. All interfaces ("", 0.0.0.0, ::) and names that do not resolve
// count as beyond.
func loopbackHost(ctx context.Context, host string) bool {
	if host == "" {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return false
		}
	}
	return true
}

// natsListenSecurity is the authentication and TLS of the embedded
// server's client port: what to set in the server's options, and the
// options of the sidecar's own connection, which is in-process.
//
// With a user and password the server requires credentials of every
// client, the sidecar's too: the sidecar gets an nkey of its own, made
// anew at each start, which the server accepts on in-process connections
// only (jwt.ConnectionTypeInProcess), so it is of no use on the port even
// if it leaked. Client certificates are asked for in the TLS handshake,
// which in-process connections skip (nats-server does not require TLS of
// them), so they alone need nothing of the sidecar's connection.
func natsListenSecurity(cfg Config) (configure func(*server.Options), own []nats.Option, err error) {
	if cfg.NATSListen == "" {
		return nil, nil, nil
	}
	var users []*server.User
	var nkeyUsers []*server.NkeyUser
	if cfg.NATSListenUser != "" {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, nil, fmt.Errorf("the sidecar's nkey for the embedded server: %w", err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, nil, fmt.Errorf("the sidecar's nkey for the embedded server: %w", err)
		}
		users = []*server.User{{Username: cfg.NATSListenUser, Password: cfg.NATSListenPassword}}
		nkeyUsers = []*server.NkeyUser{{Nkey: pub,
			AllowedConnectionTypes: map[string]struct{}{jwt.ConnectionTypeInProcess: {}}}}
		own = append(own, nats.Nkey(pub, kp.Sign))
	}
	var tlsConf *tls.Config
	if cfg.NATSListenTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.NATSListenTLSCert, cfg.NATSListenTLSKey)
		if err != nil {
			return nil, nil, fmt.Errorf("--nats-listen-tls-cert/--nats-listen-tls-key: %w", err)
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if cfg.NATSListenTLSClientCA != "" {
			pool, err := loadCA(cfg.NATSListenTLSClientCA)
			if err != nil {
				return nil, nil, fmt.Errorf("--nats-listen-tls-client-ca: %w", err)
			}
			// Required, not only asked for as on the APIs: the port
			// has no other way in for a client without a password.
			tlsConf.ClientCAs, tlsConf.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
	}
	configure = func(o *server.Options) {
		if users != nil {
			o.Users, o.Nkeys = users, nkeyUsers
		}
		if tlsConf != nil {
			o.TLSConfig, o.TLS, o.TLSVerify = tlsConf, true, tlsConf.ClientAuth == tls.RequireAndVerifyClientCert
		}
	}
	return configure, own, nil
}

// describeNATSListenAuth is how clients of the embedded server's client
// port authenticate, for the log.
func describeNATSListenAuth(cfg Config) string {
	var ways []string
	if cfg.NATSListenUser != "" {
		ways = append(ways, "password")
	}
	if cfg.NATSListenTLSClientCA != "" {
		ways = append(ways, "client certificate")
	}
	if len(ways) == 0 {
		return "none"
	}
	return strings.Join(ways, " and ")
}
