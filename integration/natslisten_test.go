package integration

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// --nats-listen beyond loopback without authentication is refused, with
// an error naming the flags that would allow it; with
// --allow-unauthenticated the port is open to anyone, as on loopback.
func TestSecurityNATSListenRefusal(t *testing.T) {
	listens := []string{"0.0.0.0:0", ":0"}
	if ip := hostIP(t); ip != "" {
		listens = append(listens, net.JoinHostPort(ip, "0"))
	}
	for _, listen := range listens {
		err := startFails(t, sidecar.Config{NATSListen: listen})
		for _, flag := range []string{"--nats-listen " + listen, "--nats-listen-user", "--nats-listen-tls-client-ca", "--allow-unauthenticated"} {
			if err == nil || !strings.Contains(err.Error(), flag) {
				t.Errorf("--nats-listen %s without authentication: Run = %v, want an error naming %q", listen, err, flag)
			}
		}
	}

	// Access control on the APIs does not guard the NATS port.
	a := itest.NewAccess(t)
	if err := startFails(t, sidecar.Config{NATSListen: "0.0.0.0:0"}, itest.WithAccess(a)); err == nil || !strings.Contains(err.Error(), "--nats-listen-user") {
		t.Errorf("with access control on the APIs: Run = %v, want the --nats-listen refusal", err)
	}

	for name, cfg := range map[string]sidecar.Config{
		"allowed":  {NATSListen: "0.0.0.0:0", AllowUnauthenticated: true},
		"loopback": {NATSListen: "127.0.0.1:0"},
	} {
		sc := itest.Start(t, cfg)
		if _, err := sc.JetStream().AccountInfo(ctxT(t)); err != nil { // no credentials
			t.Errorf("%s: JetStream without credentials: %v", name, err)
		}
	}
}

// With --nats-listen-user and --nats-listen-password (plaintext or its
// bcrypt hash), clients of the port need them: none, a wrong password or
// the hash itself are refused; with them a client uses JetStream, in the
// account the sidecar keeps its topics in. The sidecar itself, which has
// no password, still serves Google's client.
func TestSecurityNATSListenPassword(t *testing.T) {
	const user, password = "ops", "nats-listen-password-1"
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, stored string
		opts         []itest.Option
	}{
		{"plaintext", password, nil},
		{"bcrypt hash", string(hash), nil},
		// The command line: the password from the environment.
		{"binary", "", []itest.Option{itest.Binary(itest.BuildSidecar(t)), itest.Env("JETORDER_NATS_LISTEN_PASSWORD=" + password)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listen := "0.0.0.0:0"
			if tc.opts != nil { // a binary's port is known only if chosen here
				_, port, _ := net.SplitHostPort(itest.FreeAddr(t))
				listen = "0.0.0.0:" + port
			}
			sc := itest.Start(t, sidecar.Config{NATSListen: listen, NATSListenUser: user, NATSListenPassword: tc.stored}, tc.opts...)
			roundTrip(t, sc.GoClient(), "nats-listen-"+tc.name)

			for name, opts := range map[string][]nats.Option{
				"no credentials":       nil,
				"wrong password":       {nats.UserInfo(user, "not-the-password-at-all")},
				"another user":         {nats.UserInfo("admin", password)},
				"the hash as password": {nats.UserInfo(user, string(hash))},
			} {
				nc, err := nats.Connect(sc.NATS, opts...)
				if err == nil {
					nc.Close()
				}
				if !errors.Is(err, nats.ErrAuthorization) {
					t.Errorf("%s: Connect = %v, want %v", name, err, nats.ErrAuthorization)
				}
			}

			js := sc.JetStream(nats.UserInfo(user, password))
			useJetStream(t, js, 1) // the round trip's topic
		})
	}
}

// With --nats-listen-tls-client-ca the port requires a client certificate
// its CA signed: a client without one, or with another CA's, is refused
// in the TLS handshake; with one it uses JetStream. With a password as
// well, a client needs both. The sidecar's own connection needs neither.
func TestSecurityNATSListenClientCertificate(t *testing.T) {
	certs := testutil.NewCerts(t)
	other := testutil.NewCerts(t) // a CA the sidecar does not trust
	const user, password = "ops", "nats-listen-password-1"
	trusting := nats.RootCAs(certs.CA)
	withCert := nats.ClientCert(certs.ClientCert, certs.ClientKey)
	for _, tc := range []struct {
		name           string
		user, password string
		good           []nats.Option
		bad            map[string][]nats.Option
	}{
		{
			name: "certificate",
			good: []nats.Option{trusting, withCert},
			bad: map[string][]nats.Option{
				"no certificate":            {trusting},
				"certificate of another CA": {trusting, nats.ClientCert(other.ClientCert, other.ClientKey)},
				"plaintext":                 nil, // nats.go upgrades, and trusts only the system's CAs
			},
		},
		{
			name: "certificate and password", user: user, password: password,
			good: []nats.Option{trusting, withCert, nats.UserInfo(user, password)},
			bad: map[string][]nats.Option{
				"password without certificate": {trusting, nats.UserInfo(user, password)},
				"certificate without password": {trusting, withCert},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := itest.Start(t, sidecar.Config{NATSListen: "0.0.0.0:0", NATSListenUser: tc.user, NATSListenPassword: tc.password,
				NATSListenTLSCert: certs.ServerCert, NATSListenTLSKey: certs.ServerKey, NATSListenTLSClientCA: certs.CA})
			roundTrip(t, sc.GoClient(), "nats-listen-"+tc.name)
			u, err := url.Parse(sc.NATS)
			if err != nil {
				t.Fatal(err)
			}
			// The server certificate names 127.0.0.1, not 0.0.0.0.
			addr := "tls://127.0.0.1:" + u.Port()

			for name, opts := range tc.bad {
				nc, err := nats.Connect(addr, opts...)
				if err == nil {
					nc.Close()
				}
				if !isTLSFailure(err) && !errors.Is(err, nats.ErrAuthorization) {
					t.Errorf("%s: Connect = %v, want a TLS or authorization error", name, err)
				}
			}
			nc, err := nats.Connect(addr, tc.good...)
			if err != nil {
				t.Fatalf("Connect with the certificate: %v", err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			useJetStream(t, js, 1)
		})
	}
}

// useJetStream checks that js sees at least streams streams (the
// sidecar's, so the same account), and that it can create a stream,
// publish to it and delete it.
func useJetStream(t *testing.T, js jetstream.JetStream, streams int) {
	t.Helper()
	ctx := ctxT(t)
	info, err := js.AccountInfo(ctx)
	if err != nil {
		t.Fatalf("AccountInfo: %v", err)
	}
	if info.Streams < streams {
		t.Errorf("the account has %d streams, want at least %d: not the sidecar's account", info.Streams, streams)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "NATS_LISTEN_TEST", Subjects: []string{"nats-listen-test"}}); err != nil {
		t.Fatalf("CreateStream: %v", err)
	}
	if _, err := js.Publish(ctx, "nats-listen-test", []byte("x")); err != nil {
		t.Errorf("Publish: %v", err)
	}
	if err := js.DeleteStream(ctx, "NATS_LISTEN_TEST"); err != nil {
		t.Errorf("DeleteStream: %v", err)
	}
}

// hostIP is an address of this host beyond loopback, or "" if it has none.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return ""
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
