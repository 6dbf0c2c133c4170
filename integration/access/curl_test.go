package access

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/textproto"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// curlResp is what curl received.
type curlResp struct {
	code   int
	header http.Header
	body   string
}

// restError is Google's JSON error body.
type restError struct {
	Error struct {
		Code    int    `json:"code"`
		Status  string `json:"status"`
		Message string `json:"message"`
	} `json:"error"`
}

// curl runs the curl binary with args (after its own: no .curlrc, no
// proxy, the sidecar's CA) on path under the sidecar's HTTPS base URL.
func curl(t *testing.T, sc *itest.Sidecar, a *itest.Access, method, path, body string, args ...string) curlResp {
	t.Helper()
	dir := t.TempDir()
	headers, out := filepath.Join(dir, "headers"), filepath.Join(dir, "body")
	all := []string{"-q", "--silent", "--show-error", "--noproxy", "*", "--max-time", "30",
		"--cacert", a.Certs.CA, "-X", method, "-D", headers, "-o", out, "--write-out", "%{http_code}"}
	if body != "" {
		all = append(all, "-H", "Content-Type: application/json", "--data-binary", body)
	}
	all = append(append(all, args...), sc.HTTPURL()+path)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "curl", all...)
	got, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("curl %s %s: %v\n%s", method, path, err, stderr)
	}
	r := curlResp{header: http.Header{}}
	if r.code, err = strconv.Atoi(strings.TrimSpace(string(got))); err != nil {
		t.Fatalf("curl %s %s: status %q", method, path, got)
	}
	hf, err := os.Open(headers)
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	tp := textproto.NewReader(bufio.NewReader(hf))
	if _, err := tp.ReadLine(); err != nil { // the status line
		t.Fatal(err)
	}
	h, err := tp.ReadMIMEHeader()
	if err != nil && len(h) == 0 {
		t.Fatalf("curl %s %s: headers: %v", method, path, err)
	}
	r.header = http.Header(h)
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	r.body = string(b)
	return r
}

func bearer(token string) []string { return []string{"-H", "Authorization: Bearer " + token} }

// wantError checks that r is Google's JSON error with code and status.
func wantError(t *testing.T, what string, r curlResp, code int, status string) restError {
	t.Helper()
	var e restError
	if r.code != code {
		t.Errorf("%s: HTTP %d %s, want %d", what, r.code, r.body, code)
	}
	if err := json.Unmarshal([]byte(r.body), &e); err != nil || e.Error.Code != code || e.Error.Status != status {
		t.Errorf("%s: body %q (%v), want a JSON error %d %s", what, r.body, err, code, status)
	}
	return e
}

// The real curl against the REST API over HTTPS: tokens in the
// Authorization header (the publisher publishes, the viewer is 403), no
// credentials is 401 with WWW-Authenticate, a valid token in the query
// string is 401 all the same, and a client certificate authenticates
// without any token.
func TestCurlREST(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	a := itest.NewAccess(t)
	sc := itest.Start(t, sidecar.Config{}, itest.WithAccess(a))
	topic := "/v1/" + topicPath("curl-orders")
	publish := `{"messages": [{"data": "aGVsbG8=", "orderingKey": "k"}]}`

	r := curl(t, sc, a, "PUT", topic, `{}`, bearer(a.Token("admin"))...)
	if r.code != http.StatusOK || !strings.Contains(r.body, `"name":"`+topicPath("curl-orders")+`"`) {
		t.Fatalf("PUT topic as admin: %d %s", r.code, r.body)
	}

	r = curl(t, sc, a, "POST", topic+":publish", publish, bearer(a.Token("publisher"))...)
	var ids struct {
		MessageIDs []string `json:"messageIds"`
	}
	if err := json.Unmarshal([]byte(r.body), &ids); r.code != http.StatusOK || err != nil || len(ids.MessageIDs) != 1 {
		t.Errorf("publish as publisher: %d %s", r.code, r.body)
	}

	r = curl(t, sc, a, "POST", topic+":publish", publish, bearer(a.Token("viewer"))...)
	wantError(t, "publish as viewer", r, http.StatusForbidden, "PERMISSION_DENIED")

	r = curl(t, sc, a, "POST", topic+":publish", publish)
	wantError(t, "publish without a token", r, http.StatusUnauthorized, "UNAUTHENTICATED")
	if got := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
		t.Errorf("publish without a token: WWW-Authenticate %q, want a Bearer challenge", got)
	}

	r = curl(t, sc, a, "POST", topic+":publish?access_token="+a.Token("publisher"), publish)
	e := wantError(t, "publish with access_token in the query string", r, http.StatusUnauthorized, "UNAUTHENTICATED")
	mustContain(t, "publish with access_token in the query string", e.Error.Message, "query string")

	// The client certificate's principal is admin: it creates a topic
	// with no token, which the viewer then reads with its own.
	certTopic := "/v1/" + topicPath("curl-by-cert")
	r = curl(t, sc, a, "PUT", certTopic, `{"labels": {"made-by": "cert"}}`, "--cert", a.Certs.ClientCert, "--key", a.Certs.ClientKey)
	if r.code != http.StatusOK || !strings.Contains(r.body, `"name":"`+topicPath("curl-by-cert")+`"`) {
		t.Errorf("PUT topic with a client certificate: %d %s", r.code, r.body)
	}
	r = curl(t, sc, a, "GET", certTopic, "", bearer(a.Token("viewer"))...)
	if r.code != http.StatusOK || !strings.Contains(r.body, `"made-by":"cert"`) {
		t.Errorf("GET the certificate's topic as viewer: %d %s", r.code, r.body)
	}
}
