package itest

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/oauth"

	"github.com/jetorder/jetorder/internal/testutil"
)

// AccessRoles are the roles of the access-control tests' principals, by
// the last part of their names ("roles/pubsub.admin" is "admin"); "none"
// is a principal the policy grants nothing.
var AccessRoles = []string{"admin", "editor", "publisher", "subscriber", "viewer", "none"}

// AccessPrincipal is the principal that holds role in every project.
func AccessPrincipal(role string) string { return "user:" + role + "@example.com" }

// CertPrincipal is the principal of the client certificate of
// testutil.Certs (CommonName "client"); the policy makes it admin.
const CertPrincipal = "serviceAccount:client"

// Access is the configuration of a sidecar with access control: a CA and
// its certificates, a token for each of AccessRoles, and a project policy
// that grants each principal its role in every project.
type Access struct {
	Certs                  testutil.Certs
	TokensFile, PolicyFile string
	tokens                 map[string]string
}

// NewAccess writes the files of an Access into a temporary directory.
func NewAccess(t testing.TB) *Access {
	t.Helper()
	dir := t.TempDir()
	a := &Access{Certs: testutil.NewCerts(t), tokens: map[string]string{},
		TokensFile: filepath.Join(dir, "tokens"), PolicyFile: filepath.Join(dir, "policy.json")}
	tokens := "# principal token\n"
	type binding struct {
		Role    string   `json:"role"`
		Members []string `json:"members"`
	}
	var policy struct {
		Bindings []binding `json:"bindings"`
	}
	for _, role := range AccessRoles {
		a.tokens[role] = "tok-" + role + "-" + rand.Text()
		tokens += AccessPrincipal(role) + " " + a.tokens[role] + "\n"
		if role != "none" {
			policy.Bindings = append(policy.Bindings, binding{"roles/pubsub." + role, []string{AccessPrincipal(role)}})
		}
	}
	policy.Bindings = append(policy.Bindings, binding{"roles/pubsub.admin", []string{CertPrincipal}})
	pol, err := json.Marshal(policy)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.TokensFile, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.PolicyFile, pol, 0o600); err != nil {
		t.Fatal(err)
	}
	return a
}

// Token is the bearer token of role's principal.
func (a *Access) Token(role string) string {
	tok, ok := a.tokens[role]
	if !ok {
		panic(fmt.Sprintf("itest: no role %q in AccessRoles", role))
	}
	return tok
}

// TokenSource is an oauth2 token source of a fixed bearer token, as
// option.WithTokenSource takes.
func TokenSource(token string) oauth2.TokenSource {
	return oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token, TokenType: "Bearer", Expiry: time.Now().Add(time.Hour)})
}

// GoClientAs is Google's Go client for the sidecar's gRPC API over TLS,
// sending token as Google's clients send theirs (option.WithTokenSource).
// The sidecar needs the TLS or WithAccess option.
func (s *Sidecar) GoClientAs(token string, opts ...option.ClientOption) *pubsub.Client {
	s.t.Helper()
	if s.o.tls == nil {
		s.t.Fatal("itest: GoClientAs needs a sidecar with TLS")
	}
	c, err := pubsub.NewClient(context.Background(), Project, append([]option.ClientOption{
		option.WithEndpoint(s.GRPC),
		option.WithTokenSource(TokenSource(token)),
		option.WithGRPCDialOption(s.tlsCreds()),
		option.WithTelemetryDisabled(),
	}, opts...)...)
	if err != nil {
		s.t.Fatalf("pubsub.NewClient: %v", err)
	}
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// ConnAs is a raw gRPC connection to the sidecar over TLS that sends token
// with every call; "" sends none.
func (s *Sidecar) ConnAs(token string) *grpc.ClientConn {
	s.t.Helper()
	var opts []grpc.DialOption
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(oauth.TokenSource{TokenSource: TokenSource(token)}))
	}
	return s.Conn(opts...)
}

// ClientCertConn is a raw gRPC connection to the sidecar that presents the
// client certificate of certs (mutual TLS) and no token.
func (s *Sidecar) ClientCertConn(certs testutil.Certs) *grpc.ClientConn {
	s.t.Helper()
	cert, err := tls.LoadX509KeyPair(certs.ClientCert, certs.ClientKey)
	if err != nil {
		s.t.Fatal(err)
	}
	return Dial(s.t, s.GRPC, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: certs.Pool, Certificates: []tls.Certificate{cert}})))
}

// HTTPClient is an HTTP client that trusts the sidecar's CA (with the TLS
// or WithAccess option); the sidecar's HTTP API is at s.HTTPURL().
func (s *Sidecar) HTTPClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if s.o.tls != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: s.o.tls.Pool}
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: tr}
	s.t.Cleanup(c.CloseIdleConnections)
	return c
}

// HTTPURL is the base URL of the sidecar's HTTP API: https with TLS.
func (s *Sidecar) HTTPURL() string {
	if s.o.tls != nil {
		return "https://" + s.HTTP
	}
	return "http://" + s.HTTP
}

// JWTIssuer signs RS256 JWTs with a key of its own, whose JWKS file the
// sidecar's --auth-jwks reads.
type JWTIssuer struct {
	JWKSFile string
	key      *rsa.PrivateKey
}

// NewJWTIssuer makes a key and writes its JWKS file (kid "test").
func NewJWTIssuer(t testing.TB) *JWTIssuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	jwks, err := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "kid": "test", "alg": "RS256", "use": "sig",
		"n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes()),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	j := &JWTIssuer{JWKSFile: filepath.Join(t.TempDir(), "jwks.json"), key: key}
	if err := os.WriteFile(j.JWKSFile, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	return j
}

// Sign returns a JWT with claims, signed by the issuer's key.
func (j *JWTIssuer) Sign(t testing.TB, claims map[string]any) string {
	t.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	header, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "test"})
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	signed := b64(header) + "." + b64(payload)
	sum := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, j.key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + b64(sig)
}
