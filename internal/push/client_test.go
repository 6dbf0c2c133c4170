package push

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func newTestClient(t *testing.T, allow string, opts ...Option) *Client {
	t.Helper()
	a, err := ParseAllowList(allow)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(a, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func deliver(t *testing.T, c *Client, url string, timeout time.Duration) Result {
	t.Helper()
	req, err := NewRequest(t.Context(), url, Wrapper, testSub, testMsg)
	if err != nil {
		t.Fatal(err)
	}
	return c.Deliver(t.Context(), req, timeout)
}

func TestDeliverStatus(t *testing.T) {
	c := newTestClient(t, DefaultAllow)
	cases := []struct {
		code   int
		acked  bool
		reason Reason
	}{
		{200, true, ReasonNone}, {201, true, ReasonNone}, {202, true, ReasonNone}, {204, true, ReasonNone},
		{203, false, ReasonStatus}, {206, false, ReasonStatus},
		{400, false, ReasonStatus}, {404, false, ReasonStatus}, {429, false, ReasonStatus},
		{500, false, ReasonStatus}, {503, false, ReasonStatus},
		{301, false, ReasonRedirect}, {304, false, ReasonRedirect},
	}
	for _, tc := range cases {
		t.Run(http.StatusText(tc.code), func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.code)
			}))
			defer srv.Close()
			res := deliver(t, c, srv.URL+"/push", time.Minute)
			if res.Acked != tc.acked || res.Reason != tc.reason || res.StatusCode != tc.code {
				t.Fatalf("got %+v, want acked=%v reason=%v status=%d", res, tc.acked, tc.reason, tc.code)
			}
			if tc.acked != (res.Err == nil) {
				t.Fatalf("Err = %v with acked=%v", res.Err, res.Acked)
			}
			if tc.reason == ReasonStatus && !errors.Is(res.Err, ErrStatus) {
				t.Fatalf("Err = %v, want ErrStatus", res.Err)
			}
		})
	}
}

func TestDeliverSendsRequest(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Method + " " + r.URL.Path + " " + r.Header.Get("Content-Type") + " " + string(must(io.ReadAll(r.Body)))
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	c := newTestClient(t, DefaultAllow)
	if res := deliver(t, c, srv.URL+"/push", time.Minute); !res.Acked {
		t.Fatalf("not acked: %+v", res)
	}
	want, _ := wrapperBody(testSub, testMsg)
	if g := <-got; g != "POST /push application/json "+string(want) {
		t.Fatalf("server saw %q", g)
	}
}

func TestDeliverProcessingAcks(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // the server notices a closed connection only once the body is read
		w.WriteHeader(http.StatusProcessing)
		<-r.Context().Done() // never sends a final status
	}))
	defer srv.Close()
	c := newTestClient(t, DefaultAllow)
	res := deliver(t, c, srv.URL, time.Minute)
	if !res.Acked || res.StatusCode != http.StatusProcessing {
		t.Fatalf("got %+v, want acked with 102", res)
	}
}

func TestDeliverNoRedirect(t *testing.T) {
	var targetHits atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		targetHits.Add(1)
	}))
	defer target.Close()
	for _, code := range []int{301, 302, 303, 307, 308} {
		src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+"/elsewhere", code)
		}))
		c := newTestClient(t, DefaultAllow) // the target is allowed too: only the redirect policy stops it
		res := deliver(t, c, src.URL, time.Minute)
		src.Close()
		if res.Acked || res.Reason != ReasonRedirect || res.StatusCode != code || !errors.Is(res.Err, ErrRedirect) {
			t.Errorf("%d: got %+v, want a redirect nack", code, res)
		}
		if !strings.Contains(res.Err.Error(), "/elsewhere") {
			t.Errorf("%d: error %q does not name the Location", code, res.Err)
		}
	}
	if n := targetHits.Load(); n != 0 {
		t.Fatalf("redirect target saw %d requests", n)
	}
}

func TestDeliverTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // answers only when the client gives up
	}))
	defer srv.Close()
	c := newTestClient(t, DefaultAllow)
	res := deliver(t, c, srv.URL, 50*time.Millisecond)
	if res.Acked || res.Reason != ReasonTimeout || !errors.Is(res.Err, ErrTimeout) {
		t.Fatalf("got %+v, want a timeout nack", res)
	}
}

func TestDeliverCanceled(t *testing.T) {
	arrived := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		close(arrived)
		<-r.Context().Done()
	}))
	defer srv.Close()
	c := newTestClient(t, DefaultAllow)
	ctx, cancel := context.WithCancel(t.Context())
	req, err := NewRequest(ctx, srv.URL, Wrapper, testSub, testMsg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan Result, 1)
	go func() { done <- c.Deliver(ctx, req, time.Minute) }()
	<-arrived
	cancel()
	res := <-done
	if res.Acked || res.Reason != ReasonCanceled || !errors.Is(res.Err, context.Canceled) {
		t.Fatalf("got %+v, want canceled", res)
	}
}

func TestDeliverRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c := newTestClient(t, DefaultAllow)
	res := deliver(t, c, "http://"+addr+"/push", time.Minute)
	if res.Acked || res.Reason != ReasonRefused || !errors.Is(res.Err, ErrRefused) {
		t.Fatalf("got %+v, want refused", res)
	}
}

func TestDeliverDialCheck(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.Host == "" {
			t.Error("no Host")
		}
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	resolveTo := func(ip string) Option {
		return WithLookup(func(context.Context, string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr(ip)}, nil
		})
	}
	url := "http://app.internal:" + strconv.Itoa(port) + "/push"

	// An allowed name is dialed at the address it resolves to ...
	c := newTestClient(t, "app.internal", resolveTo("127.0.0.1"))
	if res := deliver(t, c, url, time.Minute); !res.Acked {
		t.Fatalf("allowed name: %+v", res)
	}
	// ... unless that is an address no name may reach.
	c = newTestClient(t, "app.internal", resolveTo("169.254.169.254"))
	if res := deliver(t, c, url, time.Minute); res.Reason != ReasonNotAllowed || !errors.Is(res.Err, ErrNotAllowed) {
		t.Fatalf("rebound name: %+v", res)
	}
	// An address outside the list is not dialed, whatever the URL says.
	c = newTestClient(t, "10.0.0.0/8")
	if res := deliver(t, c, srv.URL, time.Minute); res.Reason != ReasonNotAllowed {
		t.Fatalf("disallowed address: %+v", res)
	}
	if n := hits.Load(); n != 1 {
		t.Fatalf("server saw %d requests, want 1", n)
	}
}

func TestDeliverHugeResponseNotReadWhole(t *testing.T) {
	const total = 64 << 20
	type outcome struct {
		written int
		err     error
	}
	out := make(chan outcome, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		chunk := make([]byte, 32<<10)
		n := 0
		var err error
		for n < total {
			var k int
			if k, err = w.Write(chunk); err != nil {
				break
			}
			n += k
			w.(http.Flusher).Flush()
		}
		out <- outcome{n, err}
	}))
	defer srv.Close()
	c := newTestClient(t, DefaultAllow)
	res := deliver(t, c, srv.URL, time.Minute)
	if !res.Acked {
		t.Fatalf("got %+v", res)
	}
	o := <-out
	if o.err == nil || o.written >= total {
		t.Fatalf("server wrote %d bytes without error: the client read the whole body", o.written)
	}
}

func TestDeliverReusesConnection(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok, thanks")) // a short body, drained
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := newTestClient(t, DefaultAllow)
	for range 3 {
		if res := deliver(t, c, srv.URL, time.Minute); !res.Acked {
			t.Fatalf("got %+v", res)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for 3 sequential requests, want 1", n)
	}
}

func TestNewClientOptions(t *testing.T) {
	a, _ := ParseAllowList(DefaultAllow)
	if _, err := NewClient(nil); err == nil {
		t.Error("NewClient(nil) succeeded")
	}
	if _, err := NewClient(a, WithDrainLimit(-1)); err == nil {
		t.Error("negative drain limit accepted")
	}
	if _, err := NewClient(a, WithLookup(nil)); err == nil {
		t.Error("nil lookup accepted")
	}
}

func TestBackoff(t *testing.T) {
	cases := []struct {
		attempt  int
		min, max time.Duration
		lo, hi   time.Duration
	}{
		{1, DefaultMinBackoff, DefaultMaxBackoff, 80 * time.Millisecond, 100 * time.Millisecond},
		{2, DefaultMinBackoff, DefaultMaxBackoff, 160 * time.Millisecond, 200 * time.Millisecond},
		{4, DefaultMinBackoff, DefaultMaxBackoff, 640 * time.Millisecond, 800 * time.Millisecond},
		{30, DefaultMinBackoff, DefaultMaxBackoff, 48 * time.Second, 60 * time.Second},
		{1 << 30, 10 * time.Second, 600 * time.Second, 480 * time.Second, 600 * time.Second},
		{1, 10 * time.Second, 600 * time.Second, 10 * time.Second, 10 * time.Second}, // never below min
		{0, time.Second, time.Minute, time.Second, time.Second},
		{3, 0, 0, 0, 0},
		{3, 0, time.Second, 320 * time.Millisecond, 400 * time.Millisecond},
		{3, time.Second, time.Millisecond, time.Second, time.Second}, // max below min
		{100, time.Duration(1<<62) / 3, time.Duration(1<<63 - 1), 0, time.Duration(1<<63 - 1)},
	}
	for _, c := range cases {
		for range 200 {
			d := Backoff(c.attempt, c.min, c.max)
			if d < c.lo || d > c.hi || d < 0 {
				t.Fatalf("Backoff(%d, %v, %v) = %v, want within [%v, %v]", c.attempt, c.min, c.max, d, c.lo, c.hi)
			}
		}
	}
}

func must(b []byte, _ error) []byte { return b }
