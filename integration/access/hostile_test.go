package access

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
	"github.com/jetorder/jetorder/internal/testutil"
)

// JWTs: a valid one names its principal; forged, expired, wrong-audience,
// wrong-issuer and unsigned ones are UNAUTHENTICATED on both ports, and
// each refusal is in the audit log with its reason.
func TestHostileTokens(t *testing.T) {
	a := itest.NewAccess(t)
	issuer := itest.NewJWTIssuer(t)
	var logs testutil.LogBuffer
	sc := itest.Start(t, sidecar.Config{AuthJWKS: issuer.JWKSFile, AuthJWTIssuer: "https://issuer.example", AuthJWTAudiences: []string{"jetorder"}},
		itest.WithAccess(a), itest.Logger(slog.New(slog.NewTextHandler(&logs, nil))))
	ctx := ctxT(t)
	now := time.Now()
	claims := func(change func(map[string]any)) map[string]any {
		c := map[string]any{"iss": "https://issuer.example", "aud": "jetorder", "sub": "system:serviceaccount:apps:billing",
			"email": "admin@example.com", "exp": now.Add(time.Hour).Unix(), "iat": now.Unix()}
		if change != nil {
			change(c)
		}
		return c
	}
	valid := issuer.Sign(t, claims(nil))
	if _, err := pb.NewPublisherClient(sc.ConnAs(valid)).CreateTopic(ctx, &pb.Topic{Name: topicPath("by-jwt")}); err != nil {
		t.Fatalf("CreateTopic with a valid JWT (admin by its email): %v", err)
	}
	other := itest.NewJWTIssuer(t)
	hostile := map[string]string{
		"forged":         other.Sign(t, claims(nil)),
		"expired":        issuer.Sign(t, claims(func(c map[string]any) { c["exp"] = now.Add(-time.Hour).Unix() })),
		"wrong audience": issuer.Sign(t, claims(func(c map[string]any) { c["aud"] = "another-service" })),
		"wrong issuer":   issuer.Sign(t, claims(func(c map[string]any) { c["iss"] = "https://evil.example" })),
		"unsigned":       strings.Join(strings.Split(valid, ".")[:2], ".") + ".",
		"tampered":       tamper(valid),
	}
	hc := sc.HTTPClient()
	for name, tok := range hostile {
		_, err := pb.NewPublisherClient(sc.ConnAs(tok)).GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath("by-jwt")})
		wantCode(t, "gRPC with a "+name+" JWT", err, codes.Unauthenticated)
		code, body := httpDo(t, hc, "GET", sc.HTTPURL()+"/v1/"+topicPath("by-jwt"), tok, "")
		if code != http.StatusUnauthorized || !strings.Contains(body, "UNAUTHENTICATED") {
			t.Errorf("REST with a %s JWT: %d %s, want 401 UNAUTHENTICATED", name, code, body)
		}
	}
	for _, reason := range []string{"token expired", "audience", "issuer", "signature"} {
		if !strings.Contains(logs.String(), reason) {
			t.Errorf("the audit log names no refusal for %q:\n%s", reason, logs.String())
		}
	}

	// A valid token in the query string is refused: it would end up in
	// access logs and browser histories.
	code, body := httpDo(t, hc, "GET", sc.HTTPURL()+"/v1/"+topicPath("by-jwt")+"?access_token="+a.Token("admin"), "", "")
	if code != http.StatusUnauthorized || !strings.Contains(body, "query string") {
		t.Errorf("a token in the query string: %d %s, want 401 naming the query string", code, body)
	}
	// Another scheme than Bearer.
	req, _ := http.NewRequest("GET", sc.HTTPURL()+"/v1/"+topicPath("by-jwt"), nil)
	req.Header.Set("Authorization", "Basic "+a.Token("admin"))
	if resp, err := hc.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("Authorization: Basic: %d, want 401", resp.StatusCode)
		}
	}
	// The open endpoints need nothing.
	if code, body := httpDo(t, hc, "GET", sc.HTTPURL()+"/healthz", "", ""); code != http.StatusOK {
		t.Errorf("/healthz without a token: %d %s", code, body)
	}
}

// tamper changes the payload of a JWT and keeps its signature.
func tamper(jwt string) string {
	parts := strings.Split(jwt, ".")
	p := []byte(parts[1])
	p[len(p)/2] ^= 1
	return parts[0] + "." + string(p) + "." + parts[2]
}

func httpDo(t *testing.T, hc *http.Client, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Start-up refuses what would be unsafe or wrong: listening beyond
// loopback without access control (unless --allow-unauthenticated), a
// policy file with an unknown role, and a token file with a short token.
func TestStartRefusals(t *testing.T) {
	a := itest.NewAccess(t)
	dir := t.TempDir()
	badPolicy := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(badPolicy, []byte(`{"bindings":[{"role":"roles/pubsub.owner","members":["user:a@example.com"]}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	shortTokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(shortTokens, []byte("user:a@example.com secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		cfg  sidecar.Config
		opts []itest.Option
		want string
	}{
		{"gRPC beyond loopback", sidecar.Config{GRPCAddr: ":0"}, nil, "--allow-unauthenticated"},
		{"HTTP beyond loopback", sidecar.Config{HTTPAddr: "0.0.0.0:0"}, nil, "--allow-unauthenticated"},
		{"unknown role", sidecar.Config{IAMPolicy: badPolicy}, []itest.Option{itest.WithAccess(a)}, `role "roles/pubsub.owner" is not supported`},
		{"short token", sidecar.Config{AuthTokens: shortTokens, TLSCert: a.Certs.ServerCert, TLSKey: a.Certs.ServerKey}, nil, "shorter than 16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := itest.StartErr(t, c.cfg, c.opts...)
			if err == nil || errors.Is(err, itest.ErrNotReady) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("StartErr = %v, want an error naming %q", err, c.want)
			}
		})
	}
	// Beyond loopback with access control, or when allowed, it starts.
	itest.Start(t, sidecar.Config{GRPCAddr: ":0", HTTPAddr: "0.0.0.0:0"}, itest.WithAccess(a))
	itest.Start(t, sidecar.Config{GRPCAddr: ":0", HTTPAddr: "off", AllowUnauthenticated: true})
}

// Mutual TLS: the client certificate names the principal (CommonName
// "client", serviceAccount:client, admin in the test policy); a
// certificate from another CA does not connect.
func TestClientCertificate(t *testing.T) {
	a := itest.NewAccess(t)
	sc := itest.Start(t, sidecar.Config{}, itest.WithAccess(a))
	ctx := ctxT(t)
	conn := sc.ClientCertConn(a.Certs)
	if _, err := pb.NewPublisherClient(conn).CreateTopic(ctx, &pb.Topic{Name: topicPath("by-cert")}); err != nil {
		t.Fatalf("CreateTopic with the client certificate: %v", err)
	}
	stranger := testutil.NewCerts(t)
	stranger.Pool = a.Certs.Pool // trusts the server, but its certificate is another CA's
	_, err := pb.NewPublisherClient(sc.ClientCertConn(stranger)).GetTopic(ctx, &pb.GetTopicRequest{Topic: topicPath("by-cert")})
	if err == nil {
		t.Error("a client certificate of another CA was accepted")
	}
}
