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

// A partition counts as unowned when it holds messages, pending or
// unacked, and JetStream has pinned no receiver to it.
func TestUnownedPartitions(t *testing.T) {
	for _, tc := range []struct {
		name       string
		partitions []Partition
		want       int
	}{
		{"none", nil, 0},
		{"empty, no pin", []Partition{{Index: 0}, {Index: 1}}, 0},
		{"pending, no pin", []Partition{{Index: 0, Pending: 3}, {Index: 1}}, 1},
		{"unacked, no pin", []Partition{{Index: 0, Unacked: 1}, {Index: 1, Pending: 1, Unacked: 1}}, 2},
		{"pinned", []Partition{{Index: 0, Pending: 3, PinID: "a", Owner: "other"}, {Index: 1, Unacked: 2, PinID: "b", Owner: "this sidecar"}}, 0},
		{"owned here by this sidecar's view, no pin", []Partition{{Index: 0, Pending: 1, Owner: "this sidecar"}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Subscription{Partitions: tc.partitions}
			if got := s.UnownedPartitions(); got != tc.want {
				t.Errorf("UnownedPartitions() = %d, want %d", got, tc.want)
			}
		})
	}
}
