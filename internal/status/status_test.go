package status

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The page and its two files are served from the binary, with a policy
// that lets the page load nothing from elsewhere; nothing else is.
func TestPage(t *testing.T) {
	for _, tc := range []struct {
		path, contentType, contains string
		code                        int
	}{
		{"/", "text/html; charset=utf-8", `<script src="/status/status.js"`, http.StatusOK},
		{"/status/status.js", "text/javascript; charset=utf-8", `fetch("/v1/status"`, http.StatusOK},
		{"/status/status.css", "text/css; charset=utf-8", "table", http.StatusOK},
		{"/status/nothing.js", "", "", http.StatusNotFound},
		{"/elsewhere", "", "", http.StatusNotFound},
	} {
		rec := httptest.NewRecorder()
		Page.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		resp := rec.Result()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %d, want %d", tc.path, resp.StatusCode, tc.code)
			continue
		}
		if tc.code != http.StatusOK {
			continue
		}
		if ct := resp.Header.Get("Content-Type"); ct != tc.contentType {
			t.Errorf("%s: Content-Type %q, want %q", tc.path, ct, tc.contentType)
		}
		if !strings.Contains(string(body), tc.contains) {
			t.Errorf("%s does not contain %q", tc.path, tc.contains)
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "default-src 'none'; script-src 'self'") {
			t.Errorf("%s: Content-Security-Policy %q", tc.path, csp)
		}
	}
}
